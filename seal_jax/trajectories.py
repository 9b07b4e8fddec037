"""Rollout sequences -> the padded training batch of `seal_jax.rl` (next-token layout).

Row b holds one episode's ids right-padded to a common length T (a multiple of
`length_multiple`, so the update compiles for a few shapes only). `targets[:, t]` is the id at
t + 1, and every per-token array is aligned to targets: `loss_mask[:, t]` is True when the id at
t + 1 was sampled by the model, `sampler_logprobs[:, t]` is its log-prob under the sampler's
untempered distribution (softmax of the engine's logits), which a recompute by the trainer
should match up to numerics. With shared prompts (`train.share_prompt`), a GRPO group's prompt is
held once and its rows start at the prompt's last id (`training_batch`).
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
    sequences: Sequence[Episode],
    advantages: np.ndarray,
    length_multiple: int,
    group_size: int = 0,
) -> dict[str, np.ndarray]:
    """The rl.py batch for these episodes, with per-row (already weighted) advantages [B].

    Returns input_ids, positions, mask, targets, loss_mask, advantages and sampler_logprobs (the
    rollout's own untempered log-probs: the old log-probs with rl.old_logprobs="sampler", else
    logged against the recomputed ones).

    group_size > 0: each run of `group_size` consecutive rows (one task's rollouts) shares its
    prompt, which the batch then holds once per group, less its last id, as prompt_ids,
    prompt_positions, prompt_mask [G, P]; each row holds the rest of its sequence from the
    prompt's last id on, with positions going on from the prompt. Every per-token array stays
    aligned to targets, so the loss tokens and their log-probs are the same as without sharing.

    Raises:
      ValueError: rows of one group do not start with the same prompt.
    """
    starts = np.zeros(len(sequences), np.int64)
    if group_size:
        prompts = _group_prompts(sequences, group_size)
        starts = np.repeat([len(p) for p in prompts], group_size)
    b = len(sequences)
    t = padded_length([len(s.token_ids) - st for s, st in zip(sequences, starts)], length_multiple)
    batch = {
        "input_ids": np.zeros((b, t), np.int32),
        "mask": np.zeros((b, t), bool),
        "targets": np.zeros((b, t), np.int32),
        "loss_mask": np.zeros((b, t), bool),
        "sampler_logprobs": np.zeros((b, t), np.float32),
    }
    for row, (seq, start) in enumerate(zip(sequences, starts)):
        n = len(seq.token_ids) - start
        batch["input_ids"][row, :n] = seq.token_ids[start:]
        batch["mask"][row, :n] = True
        batch["targets"][row, : n - 1] = seq.token_ids[start + 1 :]
        batch["loss_mask"][row, : n - 1] = seq.loss_mask[start + 1 :]
        batch["sampler_logprobs"][row, : n - 1] = seq.raw_logprobs[start + 1 :]
    batch["positions"] = (starts[:, None] + np.arange(t)[None, :]).astype(np.int32)
    batch["advantages"] = np.asarray(advantages, np.float32)
    if group_size:
        batch.update(_prompt_arrays(prompts, length_multiple))
    return batch


def _group_prompts(sequences: Sequence[Episode], group_size: int) -> list[np.ndarray]:
    """Each group's shared prompt ids less the last one (which starts every row of the group)."""
    if len(sequences) % group_size:
        raise ValueError(f"{len(sequences)} rows do not make whole groups of {group_size}")
    prompts = []
    for first in range(0, len(sequences), group_size):
        group = sequences[first : first + group_size]
        prompt = group[0].token_ids[: group[0].prompt_len]
        if any(not np.array_equal(s.token_ids[: s.prompt_len], prompt) for s in group):
            raise ValueError(f"rows {first}..{first + group_size - 1} do not share their prompt")
        prompts.append(prompt[:-1])
    return prompts


def _prompt_arrays(prompts: Sequence[np.ndarray], length_multiple: int) -> dict[str, np.ndarray]:
    """prompt_ids, prompt_positions, prompt_mask [G, P] of right-padded prompts."""
    p = padded_length([len(x) for x in prompts], length_multiple)
    ids, mask = np.zeros((len(prompts), p), np.int32), np.zeros((len(prompts), p), bool)
    for g, prompt in enumerate(prompts):
        ids[g, : len(prompt)], mask[g, : len(prompt)] = prompt, True
    positions = np.broadcast_to(np.arange(p, dtype=np.int32), ids.shape).copy()
    return {"prompt_ids": ids, "prompt_positions": positions, "prompt_mask": mask}
