"""SEAL on BFCL with Qwen2.5-0.5B-Instruct or 1.5B-Instruct on one Colab TPU chip.

The setting of notebooks/seal_colab_tpu.ipynb: configs/qwen.py's (the release's environment,
prompt and evaluation protocol, fp32 master weights, bf16 compute, the paper's 16,384-token
context and G = 8 rollouts per task) at a budget that fits a Colab session: 16 steps of 8 tasks
(128 of the 400 training tasks), evaluated greedily on 32 of the 400 evaluation tasks (8 per
category) before RL, at step 8 and at the end. Set the checkpoint directory with
`--config.model.path=...` (the notebook downloads it; nothing here does).

`--config=configs/colab_tpu.py:<spec>`, where spec names a target of TARGETS (the model size and
Colab's TPU runtime: `0.5b-v5e-1`, `1.5b-v6e-1`, ...) and optionally an ablation row of
`configs.base.VARIANTS`, comma-separated: `configs/colab_tpu.py:vanilla_grpo,0.5b-v5e-1`.
`run.py --mode=compile` proves each target fits its chip (benchmarks/README.md, "Colab TPU
runtimes", has the figures and the estimated time per step).
"""

import ml_collections

from configs import qwen
from configs.base import VARIANTS

# name -> settings (dotted config keys), per model size and Colab TPU runtime (one chip each:
# v5e-1 15.75 GiB, v6e-1 32 GiB): tasks per rollout chunk, micro-steps per optimizer step, Adam's
# state. Qwen2.5-1.5B does not fit a v5e-1 (fp32 weights and their gradient sum are 11.5 of
# 15.75 GiB; decoding from those weights alone needs 16.1); on v6e-1 it fits with Adam's moments
# in host memory. Colab's v2-8 is not a target (seal_jax/estimate.py has no TPU v2 figures).
# --mode=compile figures and step-time estimates: benchmarks/README.md.
TARGETS = {
    "0.5b-v5e-1": {
        "aot.topology": "v5e:1x1",
        "rollout.micro_batch_tasks": 1,
        "optim.grad_accum": 8,
        "optim.mu_dtype": "bfloat16",
    },
    "0.5b-v6e-1": {
        "aot.topology": "v6e:1x1",
        "rollout.micro_batch_tasks": 4,
        "optim.grad_accum": 4,
    },
    "1.5b-v6e-1": {
        "aot.topology": "v6e:1x1",
        "rollout.micro_batch_tasks": 1,
        "optim.grad_accum": 8,
        "optim.mu_dtype": "bfloat16",
        "optim.moments_on_host": True,
    },
}


def get_config(spec: str = "0.5b-v5e-1") -> ml_collections.ConfigDict:
    """configs/qwen.py's setting at a Colab budget, sized for one target; `spec` as in the module
    docstring."""
    names = [name for name in spec.split(",") if name]
    variants = [name for name in names if name in VARIANTS]
    targets = [name for name in names if name in TARGETS]
    if len(variants) + len(targets) != len(names) or len(variants) > 1 or len(targets) != 1:
        raise ValueError(
            f"configs/colab_tpu.py:{spec}: give one target ({', '.join(TARGETS)}) and at most "
            f"one variant ({', '.join(VARIANTS)}), comma-separated"
        )
    c = qwen.get_config(",".join(variants))
    # A small instruct model passes few BFCL multi-turn tasks whole: with the binary reward most
    # groups would be all zeros (no signal); passed turns / graded turns credit partial progress.
    # Evaluation still counts whole tasks.
    c.rl.reward = "progress"
    c.rl.drop_constant_groups = True
    # 16 steps x 8 tasks x 8 rollouts, 4 optimizer steps per step (the paper's ratio), at twice
    # the paper's lr: a short run.
    c.train.batch_tasks = 8
    c.train.mini_batch_tasks = 2
    c.train.max_steps = 16
    c.optim.lr = 2e-6
    # Replies of up to 1,024 tokens (the paper's 4,096 cost a looping small model four times the
    # decode); the context stays the paper's 16,384 (BFCL prompts alone are up to 7.1k tokens).
    c.rollout.max_new_tokens = 1024
    c.train.eval_max_new_tokens = 1024
    # Evaluation: 32 tasks (8 per category, round-robin) under the release's protocol (the
    # paper's table), before RL, at step 8 and at the end.
    c.train.eval_every = 8
    c.train.eval_limit = 32
    c.train.eval_protocols = ("release",)
    # Fewer compiled programs (each costs tens of seconds on a TPU host): update lengths in
    # 1,024-token buckets, rollout batches of at least 8 rows.
    c.train.length_bucket = 1024
    c.rollout.min_batch = 8
    c.rollout.min_prefill_width = 64
    # A checkpoint (fp32 weights, Adam, the gradient sum: about 7 GiB for 0.5B, 20 GiB for 1.5B)
    # every 2 steps and at each evaluation; the last one and the best are kept.
    c.train.checkpoint_every = 2
    c.train.keep_checkpoints = 1
    c.train.write_report = True
    # Rollouts decode from a bf16 copy of the weights (half the bytes read per token), prefilling
    # 256 prompt tokens per row per call (at 512 the scores over a 16k cache were too large for
    # v5e); the training passes' feed-forward runs 4,096 positions at a time.
    c.rollout.sampler_tensor = 1
    c.rollout.prefill_chunk = 256
    c.model.mlp_chunk = 4096
    for key, value in TARGETS[targets[0]].items():
        section, field = key.split(".")
        c[section][field] = value
    c.train.eval_batch_tasks = c.rollout.micro_batch_tasks * c.rl.group_size
    return c
