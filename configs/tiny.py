"""The CPU default: a tiny Qwen-architecture policy learns the generated tool-use suite with SEAL.

`python run.py --config=configs/tiny.py` (the README's first command): builds a small policy
from scratch with the suite's tokenizer, warm-starts it on oracle transcripts of part of the
training tasks (so it starts well below the ceiling), evaluates it, runs SEAL RL, evaluates
again, and writes plots and report.md to the work directory. Ablation rows as for the paper:
`--config=configs/tiny.py:<variant>` (configs.base.VARIANTS).
"""

import ml_collections

from configs.base import apply_variant, base_config


def get_config(variant: str = "seal") -> ml_collections.ConfigDict:
    """Sized for about 15 minutes on 2 CPU cores. The issue's +15 points target is NOT met.

    Measured (seed 0, 2 CPU cores): this config, 13.7 min end to end while the test suite
    shared the cores (training 6m48s, evaluation 1m56s in report.md), eval mean 4.5% -> 5.5%
    (step 16) -> 5.0% (step 32). An earlier plain-only warm start: 16.5% -> 21.5% -> 16.5%.
    Why: after 300 warm-start steps the policy has the format and the right tools but does not
    yet copy argument values from the user's text (it writes the most frequent training value:
    `set_ac(temp=22)` for "25 degrees"), and RL on ~2,000 episodes does not teach copying:
    lr 1e-4 .. 1e-3, the progress reward, dropping constant groups and a full mini-batch all
    left evaluation flat (1e-3 collapses it); on 8 fixed tasks the same update does raise the
    reward (0.22 -> 0.33 in 5 steps at 1e-4).
    Copying emerges with more warm start: 1,200 plain steps (~10 min here) give 44.5%, and SEAL
    RL from there gave 44.5% -> 45.0% (step 12) -> 48.5% (step 24), but that warm start alone
    spends the budget. See benchmarks/README.md for the full record.
    """
    c = apply_variant(base_config(), variant)
    c.env.name = "suite"
    c.env.num_workers = 1
    c.env.max_model_calls = 8
    c.model.scratch.enabled = True
    c.model.param_dtype = "float32"
    c.model.compute_dtype = "float32"
    c.model.remat = False
    c.model.logprob_chunk = 256
    # 300 steps: greedy eval ~16% on the plain view alone (seed 0); 1,200: 44.5%.
    c.sft.steps = 300
    c.sft.num_tasks = 0
    c.rollout.context_limit = 1024
    c.rollout.max_new_tokens = 64
    # At 1.0 the warm-started policy's sampled success under the training interface is ~3%
    # (7 of 8 groups have zero advantage); 0.7 keeps more groups informative.
    c.rollout.temperature = 0.7
    c.train.eval_max_new_tokens = 64
    c.train.batch_tasks = 8
    c.rl.group_size = 8
    c.train.mini_batch_tasks = 4
    c.train.epochs = 1
    c.train.max_steps = 32
    c.train.eval_every = 16
    c.train.eval_batch_tasks = 100
    c.train.length_bucket = 128
    c.train.write_report = True
    # 1e-3 wrecks the output format within 4 steps; 3e-4 lowered greedy eval after 8 steps.
    c.optim.lr = 1e-4
    c.optim.weight_decay = 0.0
    c.rl.kl_coef = 0.0
    # ~70% of groups have equal rewards: train only on the others (same direction, faster steps).
    c.rl.drop_constant_groups = True
    # Adaptive units switch on after a few failing turns among the step's 64 episodes.
    c.interface.on_count = 4.0
    c.interface.off_count = 1.0
    return c
