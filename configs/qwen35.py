"""The release's current backbone: Qwen3.5-4B (hybrid Gated DeltaNet + gated full attention),
GRPO + SEAL with the release's settings.

The release's exp/SEAL.yaml (github.com/yihaohu0118/SEAL) names `Qwen/Qwen3.5-4B` as the actor
and keeps the paper's training settings, which are this project's defaults (configs/base.py):
32 tasks x 8 rollouts per step (temperature 1.0), 4 optimizer steps of 8 tasks, lr 1e-6,
gradient clip 1.0, PPO clip 0.2 / 0.2 with dual clip 10, KL to the reference 0.001 (low_var_kl,
k3), no entropy bonus, 6 epochs, evaluation every 10 steps and before training (greedy, one
sample), prompts up to 8,192 tokens, 4,096 per reply, 16,384 per episode, at most 20 model
calls per episode, gradient checkpointing. What differs from configs/qwen.py is the backbone.

Set the checkpoint directory: `--config.model.path=/path/to/Qwen3.5-4B` (nothing is downloaded;
the vision-language checkpoint loads its language model). `--config=configs/qwen35.py:<variant>`
takes an ablation row of `configs.base.VARIANTS`. The hardware targets of configs/qwen.py are
sized for Qwen2.5 and are not offered here (no `--mode=compile` memory plan for Qwen3.5 yet).
"""

import ml_collections

from configs import qwen

RELEASE_MODEL = "Qwen/Qwen3.5-4B"  # exp/SEAL.yaml: actor_rollout_ref.model.path


def get_config(spec: str = "seal") -> ml_collections.ConfigDict:
    """configs/qwen.py's release settings for the Qwen3.5-4B backbone; `spec`: an ablation
    variant of `configs.base.VARIANTS`."""
    c = qwen.get_config(spec)
    c.model.path = ""  # e.g. /mnt/models/Qwen3.5-4B
    return c
