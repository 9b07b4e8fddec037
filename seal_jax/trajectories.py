"""Rollout sequences -> the padded training batch of `seal_jax.rl` (next-token layout).

Row b holds one episode's ids right-padded to a common length T (a multiple of
`length_multiple`, so the update compiles for a few shapes only). `targets[:, t]` is the id at
t + 1, and every per-token array is aligned to targets: `loss_mask[:, t]` is True when the id at
t + 1 was sampled by the model, `sampler_logprobs[:, t]` is its log-prob under the sampler's
untempered distribution (softmax of the engine's logits), which a recompute by the trainer
should match up to numerics.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from seal_jax.rollout import Episode


def padded_length(lengths: Sequence[int], multiple: int) -> int:
    """The smallest multiple of `multiple` holding the longest sequence."""
    return max(multiple, -(-max(lengths) // multiple) * multiple)


def update_rows(
    advantages: np.ndarray, group_size: int, groups_per_mini_batch: int
) -> tuple[np.ndarray, np.ndarray]:
    """The rows an update trains on when groups without signal are dropped (DAPO's filter).

    advantages: [B] per-row advantages, groups of `group_size` consecutive rows. Returns
    (rows, trained): the row indices of every group with a non-zero advantage, then rows of
    dropped groups padding them to whole mini-batches of `groups_per_mini_batch` groups, and a
    [len(rows)] bool that is False on the padding (clear its loss mask). Both are empty when no
    group has signal, so the caller can skip the optimizer step altogether.
    """
    signal = np.any(np.asarray(advantages).reshape(-1, group_size) != 0, axis=1)
    live, dead = np.flatnonzero(signal), np.flatnonzero(~signal)
    if not live.size:
        return np.zeros(0, np.int64), np.zeros(0, bool)
    groups = np.concatenate([live, dead[: -len(live) % groups_per_mini_batch]])
    rows = (groups[:, None] * group_size + np.arange(group_size)).reshape(-1)
    return rows, np.repeat(np.arange(len(groups)) < len(live), group_size)


def training_batch(
    sequences: Sequence[Episode], advantages: np.ndarray, length_multiple: int
) -> dict[str, np.ndarray]:
    """The rl.py batch for these episodes, with per-row (already weighted) advantages [B].

    Returns input_ids, positions, mask, targets, loss_mask, advantages and sampler_logprobs (the
    rollout's own untempered log-probs: the old log-probs with rl.old_logprobs="sampler", else
    logged against the recomputed ones).
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
        batch["sampler_logprobs"][row, : n - 1] = seq.raw_logprobs[1:]
    batch["positions"] = np.broadcast_to(np.arange(t, dtype=np.int32), (b, t)).copy()
    batch["advantages"] = np.asarray(advantages, np.float32)
    return batch
