"""The release's current backbone: Qwen3.5-4B (hybrid Gated DeltaNet + gated full attention),
GRPO + SEAL with the release's settings.

The release's exp/SEAL.yaml (github.com/yihaohu0118/SEAL) names `Qwen/Qwen3.5-4B` as the actor
and keeps the paper's training settings, which are this project's defaults (configs/base.py):
32 tasks x 8 rollouts per step (temperature 1.0), 4 optimizer steps of 8 tasks, lr 1e-6,
gradient clip 1.0, PPO clip 0.2 / 0.2 with dual clip 10, KL to the reference 0.001 (low_var_kl,
k3), no entropy bonus, 6 epochs, evaluation every 10 steps and before training (greedy, one
sample), prompts up to 8,192 tokens, 4,096 per reply, 16,384 per episode, at most 20 model
calls per episode, gradient checkpointing. What differs from configs/qwen.py is the backbone
and, as in the release, thinking on in Qwen3.5's chat template with Qwen's JSON tool calls shown
(`--config.model.tool_format=auto` shows Qwen3.5's own XML calls instead).

Set the checkpoint directory: `--config.model.path=/path/to/Qwen3.5-4B` (nothing is downloaded;
the vision-language checkpoint loads its language model).
`--config=configs/qwen35.py:<spec>`, where spec names an ablation row of `configs.base.VARIANTS`,
a hardware target of TARGETS, or both, comma-separated: `configs/qwen35.py:vanilla_grpo,4b-v5p-8`.
A target keeps the paper's batch and lengths, as configs/qwen.py's targets do, and sets how rows
are split into rollout chunks and micro-steps so that every program fits the chips; `run.py
--mode=compile` proves it for the target's topology (benchmarks/README.md, "Qwen3.5-4B targets",
has the figures, compiled against benchmarks/model_configs/qwen3.5-4b: Qwen3.5-4B's text config).
"""

import ml_collections

from configs import qwen
from configs.base import VARIANTS

RELEASE_MODEL = "Qwen/Qwen3.5-4B"  # exp/SEAL.yaml: actor_rollout_ref.model.path

# name -> settings (dotted config keys), as configs/qwen.py's TARGETS: one 16k-token row per chip
# per update micro-step; rollouts decode from a bf16 sampling copy tensor-parallel over groups of
# rollout.sampler_tensor chips of one host (Qwen3.5-4B's 4 KV heads split over a group of 4; its
# linear-attention weights and recurrent states are whole on every chip of a group). No v5e
# target: the update's temporaries for one 16k row (the layer group's backward holds three
# linear layers' chunked delta rules) are 18.7 GiB per chip, beyond a v5e chip's 15.75. On v4-8,
# as for Qwen2.5-7B, Adam's moments and the reference wait in host memory.
TARGETS = {
    # The same splits as Qwen2.5-7B's targets on these chips.
    "4b-v5p-8": dict(qwen.TARGETS["7b-v5p-8"]),
    "4b-v4-8": dict(qwen.TARGETS["7b-v4-8"]),
    "4b-v6e-8": {
        "aot.topology": "v6e:2x4",
        "rollout.micro_batch_tasks": 1,
        "rollout.sampler_tensor": 4,
        "optim.grad_accum": 8,
        "optim.mu_dtype": "bfloat16",
        "model.attn_chunk": 256,
        "model.mlp_chunk": 4096,
    },
}


def get_config(spec: str = "seal") -> ml_collections.ConfigDict:
    """configs/qwen.py's release settings for the Qwen3.5-4B backbone; `spec` as in the module
    docstring."""
    names = [name for name in spec.split(",") if name]
    unknown = [name for name in names if name not in VARIANTS and name not in TARGETS]
    variants = [name for name in names if name in VARIANTS]
    targets = [name for name in names if name in TARGETS]
    if unknown or len(variants) > 1 or len(targets) > 1:
        raise ValueError(
            f"configs/qwen35.py:{spec}: give at most one variant ({', '.join(VARIANTS)}) and one "
            f"target ({', '.join(TARGETS)}), comma-separated"
        )
    c = qwen.get_config(variants[0] if variants else "seal")
    c.model.path = ""  # e.g. /mnt/models/Qwen3.5-4B
    # The release prompts Qwen3.5 as it does Qwen2.5 (exp/SEAL.yaml tool_prompt_mode:
    # bfcl_qwen_fc): Qwen's JSON <tool_call> calls, not the XML calls of Qwen3.5's own template
    # (model.tool_format=auto shows and parses those: chat format qwen35).
    c.model.tool_format = "qwen"
    # It renders with the template's default, thinking on (its enable_thinking=False is
    # commented out): each generation prompt opens <think>.
    c.rollout.enable_thinking = True
    if targets:
        for key, value in TARGETS[targets[0]].items():
            section, field = key.split(".")
            c[section][field] = value
    return c
