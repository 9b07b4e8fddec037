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
    """Sized for about 15 minutes on 2 CPU cores.

    Measured (seed 0, 2 shared CPU cores): 10.1 min end to end (warm start 2.5 min, 3 full
    evaluations of ~30 s, 32 RL steps of ~12 s); evaluation mean 16.5% before RL, 21.5% at
    step 16, 16.5% at step 32. The issue's +15 points target is NOT met. That run's warm start
    saw only the plain interface while the training rollouts saw the schema cues (sampled
    success ~14-28% plain vs ~3-8% cued); the warm start now trains on both views. Re-measured
    with that (same 300 steps over twice the transcripts, cores shared with the test suite):
    16.0 min, evaluation mean 4.5% -> 4.5% (step 16) -> 6.0% (step 32).
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
    # 300 steps: greedy eval ~16% (seed 0); 250 steps: ~10%. Warm start on the plain interface.
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
    # Adaptive units switch on after a few failing turns among the step's 64 episodes.
    c.interface.on_count = 4.0
    c.interface.off_count = 1.0
    return c
