"""The paper's setting: Qwen2.5-7B-Instruct, GRPO + SEAL (docs/method.md section 6).

Set the checkpoint directory: `--config.model.path=/path/to/Qwen2.5-7B-Instruct` (nothing is
downloaded). Other backbones of the paper: point model.path at Qwen2.5-3B-Instruct (the same
hyper-parameters).

`--config=configs/qwen.py:<spec>`, where spec names an ablation row of `configs.base.VARIANTS`
(seal, vanilla_grpo, no_env_adaptation, no_reweighting, static_utilities, closed_loop), a
hardware target of TARGETS, or both, comma-separated: `configs/qwen.py:vanilla_grpo,7b-v5p-8`.
A target keeps the paper's batch (32 tasks x 8 rollouts, 4 optimizer steps per step) and
lengths (16,384-token context, 4,096 per reply, fp32 master weights) and sets how rows are split
into rollout chunks and micro-steps so that every program fits the chips; `run.py
--mode=compile` proves it for the target's topology (benchmarks/README.md has the figures).
"""

import ml_collections

from configs.base import VARIANTS, apply_variant, base_config

# name -> settings (dotted config keys). Each keeps one 16k-token row per chip per update
# micro-step (the fewest rows that split over the chips); --mode=compile figures for each are in
# benchmarks/README.md ("Compiled for TPU targets"): all fit. On v4-8 the fp32 parameters, Adam
# state and accumulated gradient leave too little of a chip for a 16k row, so Adam's moments wait
# in host memory (optim.moments_on_host). Rollouts decode from a bf16 copy tensor-parallel over
# groups of rollout.sampler_tensor chips of one host (seal_jax/weight_sync.py), one task's 8
# rows per host at a time where the KV cache of more would not fit beside the training state.
TARGETS = {
    "7b-v5p-8": {
        "aot.topology": "v5p:2x2x1",
        "rollout.micro_batch_tasks": 2,
        "rollout.sampler_tensor": 4,
        "optim.grad_accum": 16,
    },
    "7b-v4-8": {
        "aot.topology": "v4:2x2x1",
        "rollout.micro_batch_tasks": 1,
        "rollout.sampler_tensor": 4,
        "optim.grad_accum": 16,
        "optim.mu_dtype": "bfloat16",
        "optim.moments_on_host": True,
        "rl.reference_on_host": True,
        "model.attn_chunk": 256,
        "model.mlp_chunk": 4096,
    },
    "7b-v5e-16": {
        "aot.topology": "v5e:4x4",
        "rl.reference_on_host": True,
        "rollout.micro_batch_tasks": 1,
        "rollout.sampler_tensor": 4,
        "optim.grad_accum": 4,
        "optim.mu_dtype": "bfloat16",
        "model.attn_chunk": 256,
        "model.mlp_chunk": 4096,
    },
    "7b-v5e-32": {
        "aot.topology": "v5e:4x8",
        "rollout.micro_batch_tasks": 1,
        "rollout.sampler_tensor": 4,
        "optim.grad_accum": 2,
        "optim.mu_dtype": "bfloat16",
        "model.attn_chunk": 256,
        "model.mlp_chunk": 4096,
    },
    "3b-v5e-8": {
        "aot.topology": "v5e:2x4",
        "rollout.micro_batch_tasks": 1,
        "rollout.sampler_tensor": 2,  # Qwen2.5-3B has 2 KV heads: a group of 2 splits them
        "optim.grad_accum": 8,
        "optim.mu_dtype": "bfloat16",
        "model.attn_chunk": 256,
        "model.mlp_chunk": 4096,
    },
}


def get_config(spec: str = "seal") -> ml_collections.ConfigDict:
    """Paper hyper-parameters; parameters fully sharded (FSDP) over all devices; `spec` as in the
    module docstring."""
    names = [name for name in spec.split(",") if name]
    unknown = [name for name in names if name not in VARIANTS and name not in TARGETS]
    variants = [name for name in names if name in VARIANTS]
    targets = [name for name in names if name in TARGETS]
    if unknown or len(variants) > 1 or len(targets) > 1:
        raise ValueError(
            f"configs/qwen.py:{spec}: give at most one variant ({', '.join(VARIANTS)}) and one "
            f"target ({', '.join(TARGETS)}), comma-separated"
        )
    c = apply_variant(base_config(), variants[0] if variants else "seal")
    c.model.path = ""  # e.g. /mnt/models/Qwen2.5-7B-Instruct
    c.model.param_dtype = "float32"
    c.model.compute_dtype = "bfloat16"
    c.model.remat = True
    c.mesh.data = 1
    c.mesh.fsdp = -1
    c.mesh.tensor = 1
    # The release's protocol (docs/method.md, section 1): every trajectory counts alike in the
    # loss, each trained on its first 4,096 ids after the prompt.
    c.rl.loss_agg = "seq-mean-token-mean"
    c.train.max_response_tokens = 4096
    # The release's environment and prompt (docs/protocol.md): its episode semantics in training,
    # the BFCL docs shown as they are with its cue wording, its validation environment first
    # among the evaluation protocols (the paper's table), 4,096 new tokens per reply.
    c.env.train_mode = "release"
    c.interface.prompt_style = "release"
    c.train.eval_protocols = ("release", "official")
    c.train.eval_max_new_tokens = 4096
    if targets:
        for key, value in TARGETS[targets[0]].items():
            section, field = key.split(".")
            c[section][field] = value
    return c
