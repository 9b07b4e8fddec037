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
    """Sized for 10-11 minutes on 2 CPU cores. The issue's +15 points target is NOT met.

    Measured (seed 0, 2 CPU cores, empty compilation cache): 11m00s end to end on a machine
    where the warm start runs at 2.5 steps/s (6.7 min; RL 32 steps 2.9 min, three evaluations
    1.2 min; 9m18s again with a warm cache); evaluation mean 48.0% -> 48.5% (step 16) -> 48.0%
    (step 32), +3.5 and +3.5 with RL seeds 1 and 2. The warm start covers the base and
    long_context training tasks only (part of the training tasks, as the issue asks), for 1,000
    steps: that is what it takes this 2-layer policy to fit its 200 transcripts (loss
    0.001-0.002), and the fit carries over to about half of the evaluation tasks because the
    suite's value pools are small (300 steps: 4.5% -> 5.0% with RL; the same 1,000 steps on 4x
    as many tasks: 10%). Training rollouts run with BFCL's own semantics
    (`env.train_mode="official"`, as evaluation does). What RL learns within this budget is to
    make some decodable call on the turn that reveals a held-back function (the call fails, but
    official scoring passes the task because the held-back call already ran a turn earlier).
    Whether the warm start already does that is a float-rounding accident (miss_func 26%, 42% or
    64% at step 0 for the same seed on other machines or code): where it does not, RL gains +8
    to +13.5 points (+9 on seed 0 of the earlier machine, 42.0% -> 51.0%); where it does, 0 to
    +3.5. RL does not improve copying within this budget; with BFCL's irrelevance check applied
    too (`strict_mean`) no run moves by more than a few points. See benchmarks/README.md ("The
    learning target") for the full record.
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
    # to read the conversation it copies values from (replies only for 500 steps: 22-60% on
    # seed changes; 1,000 steps: 48%).
    c.sft.steps = 500
    c.sft.all_token_fraction = 0.6
    c.sft.categories = ("base", "long_context")
    c.rollout.context_limit = 1024
    c.rollout.max_new_tokens = 64
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
    # 5e-4 went 42% -> 39.5% -> 43.5%; 1e-4 (at temperature 0.7) 42% -> 47%.
    c.optim.lr = 3e-4
    c.optim.weight_decay = 0.0
    c.rl.kl_coef = 0.0
    # ~70% of groups have equal rewards: train only on the others (same direction, faster steps).
    c.rl.drop_constant_groups = True
    # Static components (the released preset's schema cues) would make every training prompt
    # differ from the evaluation prompt; a scratch policy cannot read the cue text, and
    # warm-starting it on both views left it at 28% instead of 42%. Adaptive ones stay on.
    for component in COMPONENTS:
        if c.interface[component] == "static":
            c.interface[component] = "off"
    # Adaptive units switch on after a few failing turns among the step's 64 episodes.
    c.interface.on_count = 4.0
    c.interface.off_count = 1.0
    return c
