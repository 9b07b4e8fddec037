"""Shared defaults for every experiment config: the paper's values (docs/method.md section 6).

Experiment files (`configs/<name>.py`) call `base_config()` and override what differs. Nothing
here imports environment or model code: the config tree is plain data.
"""

import ml_collections


def base_config() -> ml_collections.ConfigDict:
    """Returns the full default config tree; every tunable of the project lives here."""
    c = ml_collections.ConfigDict()
    c.seed = 0  # task order, sampling keys, warm-start batches and the scratch policy's init

    c.model = ml_collections.ConfigDict()
    c.model.path = ""  # local Hugging Face directory (config.json, *.safetensors, tokenizer files)
    c.model.param_dtype = "float32"  # float32 | bfloat16: dtype the parameters are stored in
    c.model.compute_dtype = "bfloat16"  # float32 | bfloat16: dtype of matmuls and activations
    c.model.remat = True  # rematerialise each decoder layer in the backward pass
    c.model.logprob_chunk = 512  # sequence chunk for log-probs (never a full [B, T, V] fp32 array)
    c.model.attn_chunk = 1024  # queries per attention block in training passes (no [T, T] scores)
    c.model.mlp_chunk = 0  # positions per feed-forward block in training passes (0: all at once)
    # Attention in training passes: auto (the Pallas splash kernel on TPU: causal blocks skipped,
    # no [T, T] scores; XLA's attention in attn_chunk blocks elsewhere) | xla | splash (off TPU:
    # the kernel in Pallas' interpreter, slow)
    c.model.attention = "auto"
    # Layers per iteration of the layer scan in training passes (warm start, RL update): 1 keeps
    # compile time flat in depth; a shallow model on CPU runs faster fully unrolled (the layer
    # count). Rollouts always scan: unrolled, a CPU decode step took 1.6-1.9x as long.
    c.model.scan_unroll = 1
    # Chat and tool-call format (seal_jax/chat.py): auto (from the tokenizer's special tokens and
    # template) | qwen (its own template, <tool_call> JSON) | qwen35 (its own template, Qwen3.5's
    # XML calls) | llama3 (Llama 3.1 template, ToolACE's Python call lists, tool results as
    # ipython) | smollm2 (its own template as import_gguf writes it, SmolLM2's JSON call lists,
    # tool results as user <tool_response> messages). tool_format: auto (the chat format's) or
    # one of environments.toolcall's TOOL_FORMATS (qwen, qwen_xml, toolace, smollm2) shown to and
    # parsed from the policy instead.
    c.model.chat_format = "auto"
    c.model.tool_format = "auto"

    # A from-scratch tiny policy, used when model.path is empty (<workdir>/scratch_policy):
    # a Qwen2 architecture with the suite's tokenizer and tied embeddings.
    c.model.scratch = ml_collections.ConfigDict()
    c.model.scratch.enabled = False  # build it (only when model.path is empty)
    c.model.scratch.hidden = 128  # model width; a multiple of heads
    c.model.scratch.layers = 2  # decoder layers
    c.model.scratch.heads = 4  # attention heads; a multiple of kv_heads
    c.model.scratch.kv_heads = 2  # key/value heads (grouped-query attention)
    c.model.scratch.intermediate = 384  # MLP width

    # Supervised warm start on oracle transcripts before RL (0 steps: none). The warm-started
    # policy is saved as <workdir>/warm_start (a Hugging Face directory) and RL starts from it.
    c.sft = ml_collections.ConfigDict()
    c.sft.steps = 0  # optimizer steps (0: no warm start)
    c.sft.batch_size = 8  # transcripts per step; a multiple of mesh.data x mesh.fsdp
    c.sft.lr = 3e-3  # peak AdamW learning rate, cosine decay to 0 over sft.steps
    c.sft.warmup_steps = 0  # linear warm-up steps before the cosine decay
    # Warm-start tasks: "category" (all of its training tasks) or "category:N" (its first N);
    # empty: every training task.
    c.sft.categories = ()
    c.sft.num_tasks = 0  # training tasks whose oracle transcripts are used (0: all)
    c.sft.length_bucket = 128  # warm-start batch lengths are padded to a multiple of this
    # This fraction of the steps (the first ones) fits whole transcripts (the prompt, user and
    # tool messages too), the rest only the assistant replies: a small scratch policy first
    # learns to read the conversation it must copy from (configs/tiny.py).
    c.sft.all_token_fraction = 0.0

    # Device mesh: axis sizes; -1 takes the remaining devices. Batch is split over data x fsdp,
    # parameters over fsdp (model dim) and tensor (heads / MLP / vocab).
    c.mesh = ml_collections.ConfigDict()
    c.mesh.data = -1  # data-parallel axis (batch only)
    c.mesh.fsdp = 1  # fully sharded axis (batch and parameters)
    c.mesh.tensor = 1  # tensor-parallel axis (parameters only)

    # AdamW (decoupled weight decay, as PyTorch's) after global-norm clipping (seal_jax/optim.py).
    c.optim = ml_collections.ConfigDict()
    c.optim.lr = 1e-6  # peak learning rate (the paper's)
    c.optim.schedule = "constant"  # constant (the paper's) | cosine | linear (decay to 0)
    c.optim.warmup_steps = 0  # optimizer steps of linear warm-up from 0
    # Optimizer steps (one per mini-batch) that decaying schedules decay over; past them the lr
    # stays 0. The paper's run: ~72 steps x 4 mini-batches.
    c.optim.total_steps = 288
    c.optim.weight_decay = 0.01  # decoupled, scaled by the lr, on every parameter (the paper's)
    c.optim.b1 = 0.9  # Adam's first-moment decay
    c.optim.b2 = 0.999  # Adam's second-moment decay
    c.optim.eps = 1e-8  # Adam's denominator epsilon
    # dtype of Adam's first moment: float32 | bfloat16 (saves a quarter of the optimizer state;
    # the second moment stays float32)
    c.optim.mu_dtype = "float32"
    c.optim.grad_clip = 1.0  # global gradient-norm clip (the paper's; 0: off)
    c.optim.grad_accum = 1  # micro-batches accumulated per optimizer step
    # Keep Adam's state in host memory; the optimizer step brings it to the chips one parameter
    # at a time (seal_jax/optim.py): frees the moments' size on every chip for the update.
    c.optim.moments_on_host = False

    # GRPO with a PPO-clip loss (seal_jax/rl.py; docs/method.md section 1).
    c.rl = ml_collections.ConfigDict()
    c.rl.group_size = 8  # G rollouts per task (the paper's)
    # binary (the paper) | strict (binary, and no call on a turn that needs none: BFCL's
    # irrelevance check) | progress (passed turns / turns with a call)
    c.rl.reward = "binary"
    # Groups whose rewards are all equal have zero advantage. True drops them from the update
    # (DAPO's filter): token-mean then averages over the tokens that carry signal, and a step
    # without any such group makes no optimizer step (Adam's momentum would still move weights).
    c.rl.drop_constant_groups = False
    c.rl.adv_eps = 1e-6  # added to the group std before dividing: (r - mean) / (std + eps)
    c.rl.adv_std_normalize = True  # divide by the (unbiased) group std
    c.rl.clip_low = 0.2  # PPO ratio clip below: 1 - clip_low (the paper's)
    c.rl.clip_high = 0.2  # PPO ratio clip above: 1 + clip_high (the paper's)
    c.rl.dual_clip = 10.0  # A < 0: token loss capped at |A| * this (the paper's; 0: off, else > 1)
    c.rl.log_ratio_clamp = 20.0  # clamp of log(new / old) in the ratio and of the KL's log-ratio
    # The PPO ratio's denominator: "recompute" runs the trainer's forward pass over the batch
    # before the update (exact for the trainer's numerics, e.g. bf16 on TPU); "sampler" takes
    # the rollout engine's untempered log-probs and saves that pass (a quarter of the update),
    # right when both compute alike (float32; with "recompute" the logged
    # logprob_gap_sampler_vs_recomputed shows how far apart they are).
    c.rl.old_logprobs = "recompute"
    c.rl.kl_coef = 0.001  # weight of the KL penalty to the initial policy (0: no reference pass)
    # Keep the frozen reference in host memory, on the chips only for its log-prob pass (the
    # release offloads it too): frees its size on every chip for the update.
    c.rl.reference_on_host = False
    c.rl.kl_estimator = "k3"  # k1 | k2 | k3 ("low_var_kl", the paper's)
    c.rl.entropy_coef = 0.0  # weight of the per-token entropy bonus (the paper: none)
    # token-mean | seq-mean-token-mean | seq-mean-token-sum-norm. The release's config says
    # token-mean; its one-trajectory micro-batches made it seq-mean-token-mean in effect, which
    # configs/qwen.py (the paper's setting) uses.
    c.rl.loss_agg = "token-mean"
    # seq-mean-token-sum-norm divides each sequence's token sum by this constant (Dr. GRPO): the
    # most tokens after the prompt, 16384 context - 8192 prompt.
    c.rl.loss_token_norm = 8192.0

    # Diagnosis-weighted advantages (docs/method.md section 3; environments/weighting.py).
    c.weighting = ml_collections.ConfigDict()
    c.weighting.enabled = True  # False: every trajectory weight is 1 (vanilla GRPO's policy side)
    c.weighting.closed_loop = True  # False: static rho0 ("without closed-loop update")
    c.weighting.beta = 0.25  # EMA rate: rho <- (1 - beta) rho + beta target
    c.weighting.alpha = 1.0  # gain of prevalence * stagnation * confidence in the target
    c.weighting.confidence_k = 32  # tag count at which confidence = min(1, count / K) reaches 1
    c.weighting.mode = "all"  # all | positive | negative: which advantages' signs get weighted
    c.weighting.budget_enabled = False  # shrink and renormalise the weights (below); off
    # Budget over tagged trajectories: w <- 1 + (w - 1) / (1 + strength), clamp to
    # [1 / clamp, clamp], then divide by their mean (environments/weighting.py).
    c.weighting.budget_strength = 1.0
    c.weighting.budget_clamp = 2.0
    c.weighting.cause_utilities = False  # fine causes get utilities of their own in the weights
    # Base utility rho0 per tag (the paper's); an unlisted tag counts 1.0. The tags excluded
    # from weights and statistics ("gt_error", "checker_error") are a constant,
    # environments.diagnosis.EXCLUDED_TAGS, not a setting.
    c.weighting.rho0 = ml_collections.ConfigDict(
        {
            "spurious_tool_call": 2.0,
            "correct_abstention": 1.8,
            "empty_turn_model_response": 1.5,
            "instance_mismatch": 0.6,
            "state_mismatch": 1.0,
            "response_mismatch": 0.9,
            "pass": 1.0,
        }
    )

    # The learning interface Omega_t (docs/method.md section 4; environments/interface.py), shown
    # in training only. Switches: off | static (every tool / kind / tag) | adaptive (closed loop).
    # Defaults: the authors' released setting (INTERFACE_PRESETS["released"]); apply_variant
    # sets the others.
    c.interface = ml_collections.ConfigDict()
    c.interface.schema_cues = "static"  # [required] and enum markers per tool, instruction line
    c.interface.schema_types = False  # schema cues also name each parameter's type
    # How tools are shown, in training and evaluation (environments/rendering.py): release (the
    # BFCL docs as they are, the SEAL release's cue wording; configs/qwen.py) | chat_template
    # (OpenAI-style tools as Qwen's chat template renders them, the suite's tokenizer's text)
    c.interface.prompt_style = "chat_template"
    c.interface.affordance_cues = "off"  # per tool: a line urging its use
    c.interface.error_hints = "off"  # per error kind: an actionable line on error observations
    c.interface.guidelines = "off"  # per tag: a behavioural line in the system prompt
    # Adaptive units: evidence e <- decay * e + (turns of the step showing the failure);
    # on when e >= on_count, off again when e < off_count.
    c.interface.decay = 0.5  # evidence kept per step
    c.interface.on_count = 3.0  # evidence that switches a unit on
    c.interface.off_count = 1.0  # evidence below which an active unit switches off
    # Guidelines from the tag statistics: count, prevalence and mean-reward thresholds, top k by
    # prevalence * (1 - mean reward); excluded tags stay out of the prevalence denominator.
    c.interface.guideline_min_count = 8  # fewest occurrences of a tag (the paper's)
    c.interface.guideline_min_prevalence = 0.10  # least share of the tag counts (the paper's)
    c.interface.guideline_max_reward = 0.6  # mean episode reward must be below this (the paper's)
    c.interface.guideline_top_k = 3  # most guidelines shown at once (the paper's)

    # The environment (host side).
    c.env = ml_collections.ConfigDict()
    c.env.name = "bfcl"  # bfcl | suite
    # BFCL's 400/400 split: release (the official SEAL release's ids, the paper's) | seeded (the
    # project's own draw, seed 2605); environments/bfcl/tasks.py: SPLIT_FILES
    c.env.bfcl_split = "release"
    c.env.num_workers = 2  # environment worker processes per host
    c.env.max_model_calls = 20  # assistant messages per episode
    c.env.call_time_limit_s = 5.0  # wall-clock seconds one tool call may run
    # A worker that takes longer than this to answer one request (a call stuck where the
    # per-call limit cannot reach, e.g. in C code) is killed and replaced; its episodes fail.
    c.env.worker_timeout_s = 120.0
    # A worker whose resident memory grows past this many MiB (a leaking tool) is killed and
    # replaced; its episodes fail. 0: no limit. Linux only (read from /proc).
    c.env.worker_memory_mb = 4096.0
    # Episode semantics of training rollouts (environments/episode.py): release (the SEAL
    # release's environment; configs/qwen.py) | official (BFCL's runner) | training (schema
    # breaking calls refused, this project's option)
    c.env.train_mode = "training"
    # instance_mismatch tag: instantiated (the release's rule: instantiated class sets differ,
    # which BFCL's executor makes practically never) | touched (stricter: the classes the calls
    # ran on differ); environments/diagnosis.py
    c.env.instance_mismatch = "instantiated"

    # Rollouts (device side).
    c.rollout = ml_collections.ConfigDict()
    c.rollout.context_limit = 16384  # tokens per episode: prompt, turns, observations (the paper's)
    c.rollout.max_new_tokens = 4096  # per model turn
    c.rollout.temperature = 1.0  # training rollouts' sampling temperature (the paper's)
    c.rollout.top_k = 0  # 0: off
    c.rollout.top_p = 1.0  # nucleus sampling mass (1.0: off)
    c.rollout.micro_batch_tasks = 0  # tasks per lockstep rollout batch (0: the whole step)
    # Continuous batching (seal_jax/continuous.py): rows decoded at once per host, the episodes
    # streaming through them with an asynchronous environment pool. 0: lockstep turns over
    # chunks of micro_batch_tasks tasks. Same episodes either way for the same seed.
    c.rollout.slots = 0
    c.rollout.prefill_chunk = 512  # most prompt tokens prefilled per row per call (power of two)
    c.rollout.min_batch = 1  # fewest rows per compiled batch (power of two; fewer programs)
    c.rollout.min_prefill_width = 1  # narrowest prefill piece (power of two; fewer programs)
    c.rollout.enable_thinking = False  # Qwen3 templates: render non-thinking prompts
    # Chips per sampler group (seal_jax/weight_sync.py): rollouts decode from a compute-dtype
    # copy of the parameters, tensor-parallel over each group and replicated across groups, so
    # no weight is gathered per token. 0: decode from the trainer's own parameters on one host;
    # one group per host on several.
    c.rollout.sampler_tensor = 0

    # The training loop.
    c.train = ml_collections.ConfigDict()
    c.train.batch_tasks = 32  # B tasks per step (x rl.group_size rollouts)
    c.train.mini_batch_tasks = 8  # tasks per optimizer step (paper: 4 optimizer steps per step)
    c.train.ppo_epochs = 1  # passes of the update over each step's batch (the paper's)
    c.train.epochs = 6  # passes over the training tasks (the paper's)
    c.train.max_steps = 0  # 0: epochs * (training tasks // batch_tasks)
    c.train.eval_every = 10  # steps; also before training and at the end (0: never evaluate)
    c.train.eval_limit = 0  # evaluation tasks, round-robin over categories (0: the whole split)
    c.train.eval_batch_tasks = 32  # evaluation tasks per rollout batch
    c.train.eval_max_new_tokens = 1024  # per model turn in evaluation (greedy)
    # Evaluation protocols (environments/episode.py: PROTOCOLS), each run and reported; the
    # first one's numbers are eval/mean and pick the best checkpoint: release (the SEAL
    # release's validation environment, the paper's table; configs/qwen.py) | official (BFCL's
    # runner)
    c.train.eval_protocols = ("official",)
    c.train.checkpoint_every = 1  # steps between checkpoints (also saved at each evaluation)
    # Checkpoints are written while the next step runs (a save blocks only for the copy off the
    # devices); False: each save returns once on disk (benchmarks/README.md compares the two).
    c.train.async_checkpoints = True
    c.train.keep_checkpoints = 3  # the last K are kept, plus the best
    c.train.best_metric = "eval/mean"  # picks the best checkpoint: or eval/accuracy/<category>
    c.train.length_bucket = 256  # training batch lengths are padded to a multiple of this
    # Train on at most this many ids of each episode after its initial prompt (counted from the
    # first assistant turn's generation prompt on, tool and user ids included, as the release
    # counts them); later ids are cut from the update. 0: no cap; configs/qwen.py: 4096.
    c.train.max_response_tokens = 0
    # Update batches hold each task's prompt once for its group_size rollouts (same loss and
    # gradient, fewer tokens to run; benchmarks/README.md, "Shared prompts in the update").
    c.train.share_prompt = True
    c.train.write_report = False  # plots + report.md in the work directory after each evaluation

    # `run.py --mode=eval` also runs BFCL's single-turn and memory categories named here
    # (environments/bfcl/extra.py: a category such as simple_python or memory_kv, or a group:
    # single_turn, memory, all), reported under "extra"; empty: none
    c.eval = ml_collections.ConfigDict()
    c.eval.extra_categories = ()

    # Multi-host: jax.distributed is initialised when enabled (on TPU pods the defaults are
    # discovered automatically; on CPU/GPU clusters give the coordinator and process ids).
    c.distributed = ml_collections.ConfigDict()
    c.distributed.enabled = False  # call jax.distributed.initialize at start-up
    c.distributed.coordinator_address = ""  # host:port of process 0 ("": auto-discovered)
    c.distributed.num_processes = 0  # controller processes in all (with coordinator_address)
    c.distributed.process_id = -1  # this process's index (with coordinator_address)

    # Ahead-of-time compile check (`run.py --mode=compile`, seal_jax/aot.py).
    c.aot = ml_collections.ConfigDict()
    # jax TPU topology to compile for, e.g. "v5e:2x4", "v5p:2x2x1", "v4:2x2x1" (needs libtpu);
    # "": this host's devices
    c.aot.topology = ""
    c.aot.dump_hlo = False  # also write each program's optimized HLO to <workdir>/hlo/
    # Training on a TPU or GPU first runs the check for its own devices (before any weight is
    # read) and stops, with the check's error, when a program cannot fit.
    c.aot.check_before_train = True

    # Persistent XLA compilation cache: every compiled program (one per bucket shape) is saved
    # here and loaded by later runs instead of compiled again. "" turns it off; a directory
    # already given to JAX (JAX_COMPILATION_CACHE_DIR) takes precedence.
    c.compilation_cache_dir = "~/.cache/seal_jax/xla"
    return c


# The learning interface's components (environments/interface.py) and presets: a mode per
# component, "off" | "static" | "adaptive", and whether schema cues name parameter types.
INTERFACE_COMPONENTS = ("schema_cues", "affordance_cues", "error_hints", "guidelines")
INTERFACE_PRESETS = {
    "plain": {c: "off" for c in INTERFACE_COMPONENTS} | {"schema_types": False},
    # The authors' released setting: static schema cues (required and enum markers, the
    # instruction line) on every tool, nothing else.
    "released": {
        "schema_cues": "static",
        "affordance_cues": "off",
        "error_hints": "off",
        "guidelines": "off",
        "schema_types": False,
    },
    "closed_loop": {c: "adaptive" for c in INTERFACE_COMPONENTS} | {"schema_types": False},
}

# The paper's ablation rows (docs/method.md section 7) plus this project's closed-loop interface:
# (interface preset, weighting enabled, closed-loop utilities).
VARIANTS = {
    "seal": ("released", True, True),  # full SEAL as the authors released it (the default)
    "vanilla_grpo": ("plain", False, True),
    "no_env_adaptation": ("plain", True, True),
    "no_reweighting": ("released", False, True),
    "static_utilities": ("released", True, False),
    "closed_loop": ("closed_loop", True, True),  # every interface component adaptive
}


def apply_variant(c: ml_collections.ConfigDict, variant: str) -> ml_collections.ConfigDict:
    """Sets the interface preset and weighting switches of one ablation row (see VARIANTS)."""
    if variant not in VARIANTS:
        raise ValueError(f"unknown variant {variant!r}; use one of {', '.join(VARIANTS)}")
    preset, weighting, closed_loop = VARIANTS[variant]
    for field, value in INTERFACE_PRESETS[preset].items():
        c.interface[field] = value
    c.weighting.enabled = weighting
    c.weighting.closed_loop = closed_loop
    return c
