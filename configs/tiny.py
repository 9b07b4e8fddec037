"""The CPU default: a tiny Qwen-architecture policy learns the generated tool-use suite with SEAL.

`python run.py --config=configs/tiny.py` (the README's first command): builds a small policy
from scratch with the suite's tokenizer, warm-starts it on oracle transcripts of part of the
training tasks (so it starts well below the ceiling), evaluates it, runs SEAL RL, evaluates
again, and writes plots and report.md to the work directory. Ablation rows as for the paper:
`--config=configs/tiny.py:<variant>` (configs.base.VARIANTS).
"""

import ml_collections

from configs.base import apply_variant, base_config
from environments.interface import COMPONENTS


def get_config(variant: str = "seal") -> ml_collections.ConfigDict:
    """Sized for about 15 minutes on 2 CPU cores from an empty compilation cache.

    Measured (seed 0, empty cache, 2-core AMD EPYC): `make demo` 9m24s, evaluation 54.5% after the
    warm start -> 57.5% (step 16) -> 69.5% (step 32), +15.0 points from RL (strict mean 47.5% ->
    55.5%); from the 3 seeds' warm starts RL gains +15.0, +13.5, +12.5 (+12.0, +11.5, +11.0 without
    the entropy bonus). The float rounding of another CPU gives another warm start (a 2-core Intel
    machine: 54.5% with other categories, 1.3 warm-start steps/s against 2.2 here, so ~15 minutes
    in all). RL's gain is on miss_func and miss_param while base and long_context about hold; on
    miss_func mostly through a leniency of BFCL's checker (benchmarks/README.md). The warm start
    covers the base and long_context training tasks (part of the training tasks, as the issue asks)
    for 500 steps, the first 60% on whole transcripts: a 2-layer policy first learns to read the
    messages it copies values from. Training rollouts run with BFCL's own semantics
    (`env.train_mode="official"`, as evaluation does). benchmarks/README.md ("The learning target")
    has the record of what was tried.
    """
    c = apply_variant(base_config(), variant)
    c.env.name = "suite"
    c.env.num_workers = 1
    c.env.max_model_calls = 8
    # BFCL's execution semantics in training too: the reveal-turn behaviour RL finds is then
    # rewarded in training as in evaluation, so the gain no longer depends on the seed's luck.
    c.env.train_mode = "official"
    c.model.scratch.enabled = True
    c.model.param_dtype = "float32"
    c.model.compute_dtype = "float32"
    c.model.remat = False
    c.model.scan_unroll = 2  # the layer count: both layers unrolled, 1.2x faster steps on CPU
    c.model.logprob_chunk = 256
    # 500 steps on two categories, the first 300 on whole transcripts: the policy first learns
    # to read the conversation it copies values from (replies only, 500 steps: 22-60% over
    # variants of the recipe).
    c.sft.steps = 500
    c.sft.all_token_fraction = 0.6
    c.sft.categories = ("base", "long_context")
    c.rollout.context_limit = 1024
    c.rollout.max_new_tokens = 64
    # Batches of 1-8 rows and pieces of 1-32 tokens are padded up: each bucket the floors remove
    # was another compiled program (RL from an empty cache: 604 s -> 505 s with 256-query
    # attention blocks, same scores; prefill/decode programs 56 -> 35).
    c.rollout.min_batch = 16
    c.rollout.min_prefill_width = 64
    # The paper's 1.0: 0.7 explored too little (42% -> 47% at 32 steps, lr 1e-4).
    c.rollout.temperature = 1.0
    c.train.eval_max_new_tokens = 64
    c.train.batch_tasks = 8
    c.rl.group_size = 8
    c.train.mini_batch_tasks = 2  # 4 optimizer steps per step, the paper's ratio
    c.train.epochs = 1
    c.train.max_steps = 32
    c.train.eval_every = 16
    c.train.eval_batch_tasks = 100
    c.train.length_bucket = 128
    c.train.write_report = True
    # From one warm start: 3e-4 went 56.0% -> 61.5%, 5e-4 -> 59.5%; 1e-3 with one optimizer
    # step per step collapsed (45% -> 4%).
    c.optim.lr = 3e-4
    # Linear decay to 0 over ~80 optimizer steps, about what 32 steps make (1-4 mini-batches
    # each: those of the groups with signal); at a constant lr RL over-abstained (docstring).
    c.optim.schedule = "linear"
    c.optim.total_steps = 80
    c.optim.weight_decay = 0.0
    # A light pull to the warm start: over 3 warm starts RL gained +12.0, +11.5, +11.0 with it,
    # +11.5, +9.5, +7.0 without (0.03: +10.0, +11.0, +18.0; benchmarks/README.md).
    c.rl.kl_coef = 0.05
    # An entropy bonus keeps the policy from collapsing onto junk calls (the policy's entropy is
    # 0.03-0.12 nats per token): over 3 warm starts +15.0, +13.5, +12.5 against +12.0, +11.5,
    # +11.0 without; 0.005 and 0.02 gained less on seeds 0 and 1 (benchmarks/README.md).
    c.rl.entropy_coef = 0.01
    # Engine and trainer both compute in float32 here (recomputed log-probs differ by ~3e-7):
    # the engine's log-probs skip a forward pass per step and its 8 compiled programs, with
    # the same scores (benchmarks/README.md).
    c.rl.old_logprobs = "sampler"
    # ~70% of groups have equal rewards: train only on the others (same direction, faster steps).
    c.rl.drop_constant_groups = True
    # Static components (the released preset's schema cues) would make every training prompt
    # differ from the evaluation prompt; a scratch policy cannot read the cue text, and
    # warm-starting it on both views left it at 28% instead of 42%. The released preset has no
    # adaptive component, so the default run trains on the plain interface (report.md says so);
    # `configs/tiny.py:closed_loop` keeps every component adaptive.
    for component in COMPONENTS:
        if c.interface[component] == "static":
            c.interface[component] = "off"
    # Adaptive units (closed_loop) switch on after a few failing turns among a step's 64 episodes.
    c.interface.on_count = 4.0
    c.interface.off_count = 1.0
    return c
