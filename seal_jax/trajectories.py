"""Rollout sequences -> the padded training batch of `seal_jax.rl` (next-token layout).

Row b holds one episode's ids right-padded to a common length T (a multiple of
`length_multiple`, so the update compiles for a few shapes only). `targets[:, t]` is the id at
t + 1, and every per-token array is aligned to targets: `loss_mask[:, t]` is True when the id at
t + 1 was sampled by the model, `sampler_logprobs[:, t]` is the sampler's log-prob of it.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from seal_jax.rollout import Episode


def padded_length(lengths: Sequence[int], multiple: int) -> int:
    """The smallest multiple of `multiple` holding the longest sequence."""
    return max(multiple, -(-max(lengths) // multiple) * multiple)


def training_batch(
    sequences: Sequence[Episode], advantages: np.ndarray, length_multiple: int
) -> dict[str, np.ndarray]:
    """The rl.py batch for these episodes, with per-row (already weighted) advantages [B].

    Returns input_ids, positions, mask, targets, loss_mask, advantages and sampler_logprobs (the
    rollout's own log-probs, logged against the recomputed old log-probs).
    """
    b = len(sequences)
    t = padded_length([len(s.token_ids) for s in sequences], length_multiple)
    batch = {
        "input_ids": np.zeros((b, t), np.int32),
        "mask": np.zeros((b, t), bool),
        "targets": np.zeros((b, t), np.int32),
        "loss_mask": np.zeros((b, t), bool),
        "sampler_logprobs": np.zeros((b, t), np.float32),
    }
    for row, seq in enumerate(sequences):
        n = len(seq.token_ids)
        batch["input_ids"][row, :n] = seq.token_ids
        batch["mask"][row, :n] = True
        batch["targets"][row, : n - 1] = seq.token_ids[1:]
        batch["loss_mask"][row, : n - 1] = seq.loss_mask[1:]
        batch["sampler_logprobs"][row, : n - 1] = seq.logprobs[1:]
    batch["positions"] = np.broadcast_to(np.arange(t, dtype=np.int32), (b, t)).copy()
    batch["advantages"] = np.asarray(advantages, np.float32)
    return batch
