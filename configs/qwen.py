"""The paper's setting: Qwen2.5-7B-Instruct, GRPO + SEAL (docs/method.md section 6).

Set the checkpoint directory: `--config.model.path=/path/to/Qwen2.5-7B-Instruct` (nothing is
downloaded). Other backbones of the paper: point model.path at Qwen2.5-3B-Instruct (the same
hyper-parameters). Ablation rows: `--config=configs/qwen.py:<variant>` with a variant of
`configs.base.VARIANTS` (seal, vanilla_grpo, no_env_adaptation, no_reweighting,
static_utilities, closed_loop).
"""

import ml_collections

from configs.base import apply_variant, base_config


def get_config(variant: str = "seal") -> ml_collections.ConfigDict:
    """Paper hyper-parameters; parameters fully sharded (FSDP) over all devices."""
    c = apply_variant(base_config(), variant)
    c.model.path = ""  # e.g. /mnt/models/Qwen2.5-7B-Instruct
    c.model.param_dtype = "float32"
    c.model.compute_dtype = "bfloat16"
    c.model.remat = True
    c.mesh.data = 1
    c.mesh.fsdp = -1
    c.mesh.tensor = 1
    return c
