"""The paper's third backbone: ToolACE-2-Llama-3.1-8B, GRPO + SEAL (docs/method.md sections 6-7).

Set the checkpoint directory: `--config.model.path=/path/to/ToolACE-2-Llama-3.1-8B` (nothing is
downloaded). The hyper-parameters are configs/qwen.py's: the SEAL release has one training
config (exp/SEAL.yaml) for every backbone, and its batch, lengths (8,192-token prompts, 4,096 per
reply, 16,384 in all), optimizer, KL and SEAL settings are those. What differs is the chat and
tool format, which the release switches in its BFCL environment (`tool_prompt_mode`,
`tool_call_parser` and `tool_result_mode` set to `toolace_official_prompt`): BFCL's prompt-mode
system prompt with the docs under `arguments`, calls as a Python list `[func(a=1)]`, tool
results as `{"output": ...}` in the `ipython` role (model.chat_format=llama3; seal_jax/chat.py,
environments/toolcall.py).

`--config=configs/toolace.py:<spec>`, where spec names an ablation row of `configs.base.VARIANTS`,
a hardware target of TARGETS, or both, comma-separated: `configs/toolace.py:vanilla_grpo,8b-v5p-8`.
"""

import ml_collections

from configs import qwen
from configs.base import VARIANTS

# Qwen2.5-7B's presets (configs/qwen.py) carried over to Llama-3.1-8B: 8.0B parameters instead of
# 7.6B, an untied 128k-vocabulary head instead of a 152k one, and 2.3x the KV cache (32 layers x 8
# KV heads of 128 against 28 x 4). On v5e-32 the larger cache needs Adam's moments in host memory
# to fit beside the rollout; --mode=compile figures (benchmarks/model_configs/llama-3.1-8b) are
# in benchmarks/README.md ("Compiled for TPU targets").
TARGETS = {
    "8b-v5p-8": qwen.TARGETS["7b-v5p-8"],
    "8b-v5e-32": {**qwen.TARGETS["7b-v5e-32"], "optim.moments_on_host": True},
}


def get_config(spec: str = "seal") -> ml_collections.ConfigDict:
    """Paper hyper-parameters (configs/qwen.py's) in ToolACE's chat and tool format; `spec` as
    in the module docstring."""
    names = [name for name in spec.split(",") if name]
    variants = [name for name in names if name in VARIANTS]
    targets = [name for name in names if name in TARGETS]
    if len(variants) + len(targets) != len(names) or len(variants) > 1 or len(targets) > 1:
        raise ValueError(
            f"configs/toolace.py:{spec}: give at most one variant ({', '.join(VARIANTS)}) and one "
            f"target ({', '.join(TARGETS)}), comma-separated"
        )
    c = qwen.get_config(",".join(variants))
    c.model.path = ""  # e.g. /mnt/models/ToolACE-2-Llama-3.1-8B
    c.model.chat_format = "llama3"
    for key, value in (TARGETS[targets[0]] if targets else {}).items():
        section, field = key.split(".")
        c[section][field] = value
    return c
