"""Token sequences -> the padded next-token batch of `seal_jax.rl` (training and warm start).

Row b holds one sequence's ids right-padded to a common length T (a multiple of
`length_multiple`, so passes compile for a few shapes only). `targets[:, t]` is the id at t + 1,
and every per-token array is aligned to targets: `loss_mask[:, t]` is True when the id at t + 1
is trained on (sampled by the model, in RL), `rollout_logprobs[:, t]` is its log-prob under the
rollout policy's untempered distribution (softmax of the engine's logits), which a recompute by
the trainer should match up to numerics. With shared prompts (`train.share_prompt`), a GRPO
group's prompt is held once and its rows start at the prompt's last id (`training_batch`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

import numpy as np

from seal_jax.rollout import TokenSequence


def cap_response(sequence: TokenSequence, max_tokens: int, response_start: int) -> TokenSequence:
    """The sequence cut after the first `max_tokens` ids from `response_start` on (ids of every
    kind: sampled, tool and user), as the SEAL release truncates its training responses. Later
    ids hold no loss token any more, and no earlier id's log-prob depends on them (causal), so
    cutting them trains exactly as masking them would, without running them. The prompt ids are
    always kept.
    """
    end = max(response_start + max_tokens, sequence.prompt_len)
    if end >= len(sequence.token_ids):
        return sequence
    return dataclasses.replace(
        sequence,
        token_ids=sequence.token_ids[:end],
        loss_mask=sequence.loss_mask[:end],
        sampling_logprobs=sequence.sampling_logprobs[:end],
        policy_logprobs=sequence.policy_logprobs[:end],
    )


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


def next_token_batch(
    token_ids: Sequence[np.ndarray],
    loss_masks: Sequence[np.ndarray],
    length_multiple: int,
    starts: Sequence[int] | None = None,
    per_token: Mapping[str, Sequence[np.ndarray]] | None = None,
) -> dict[str, np.ndarray]:
    """The right-padded next-token batch of some id sequences.

    Row b holds `token_ids[b][starts[b]:]` (default start 0), its positions counting on from the
    start. Returns input_ids, positions, mask [B, T], and, aligned to targets, targets, loss_mask
    (`loss_masks[b]` shifted by one) and each array of `per_token` (name -> one float array per
    sequence, shifted alike).
    """
    starts = np.zeros(len(token_ids), np.int64) if starts is None else np.asarray(starts)
    per_token = dict(per_token or {})
    b = len(token_ids)
    t = padded_length([len(ids) - st for ids, st in zip(token_ids, starts)], length_multiple)
    batch = {
        "input_ids": np.zeros((b, t), np.int32),
        "mask": np.zeros((b, t), bool),
        "targets": np.zeros((b, t), np.int32),
        "loss_mask": np.zeros((b, t), bool),
        **{name: np.zeros((b, t), np.float32) for name in per_token},
    }
    for row, (ids, start) in enumerate(zip(token_ids, starts)):
        n = len(ids) - start
        batch["input_ids"][row, :n] = ids[start:]
        batch["mask"][row, :n] = True
        batch["targets"][row, : n - 1] = ids[start + 1 :]
        batch["loss_mask"][row, : n - 1] = loss_masks[row][start + 1 :]
        for name, values in per_token.items():
            batch[name][row, : n - 1] = values[row][start + 1 :]
    batch["positions"] = (starts[:, None] + np.arange(t)[None, :]).astype(np.int32)
    return batch


def training_batch(
    sequences: Sequence[TokenSequence],
    advantages: np.ndarray,
    length_multiple: int,
    group_size: int = 0,
) -> dict[str, np.ndarray]:
    """The rl.py batch of these rollout sequences, with per-row (already weighted) advantages [B].

    Returns `next_token_batch`'s arrays with `rollout_logprobs` (the engine's untempered
    log-probs: the old log-probs with rl.old_logprobs="sampler", else logged against the
    recomputed ones), and advantages.

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
    batch = next_token_batch(
        [s.token_ids for s in sequences],
        [s.loss_mask for s in sequences],
        length_multiple,
        starts,
        {"rollout_logprobs": [s.policy_logprobs for s in sequences]},
    )
    batch["advantages"] = np.asarray(advantages, np.float32)
    if group_size:
        batch.update(_prompt_arrays(prompts, length_multiple))
    return batch


def _group_prompts(sequences: Sequence[TokenSequence], group_size: int) -> list[np.ndarray]:
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
