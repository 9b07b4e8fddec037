"""Mini-batches of the update: rows taken longest first, each padded only to its own rows."""

import numpy as np
import pytest

from configs.tiny_test import get_config
from seal_jax import modes, update

VOCAB = 860  # below the suite tokenizer's vocabulary (suite_model's embedding rows)


@pytest.fixture(scope="module")
def updater(suite_model):
    c = get_config()
    c.model.path = suite_model
    c.train.mini_batch_tasks = 2
    c.rl.group_size = 2
    c.train.length_bucket = 16
    return update.build_updater(c, modes.load_policy(c))


def _ragged_batch(lengths, width):
    rng = np.random.default_rng(0)
    b = len(lengths)
    mask = np.arange(width)[None, :] < np.asarray(lengths)[:, None]
    ids = np.where(mask, rng.integers(2, VOCAB, (b, width)), 0).astype(np.int32)
    targets = np.where(mask, np.roll(ids, -1, axis=1), 0).astype(np.int32)
    positions = np.broadcast_to(np.arange(width, dtype=np.int32), (b, width)).copy()
    return {"input_ids": ids, "mask": mask, "targets": targets, "positions": positions}


def test_rows_are_grouped_by_length_and_padded_to_their_own_bucket(updater):
    lengths = [5, 60, 20, 61, 7, 33, 64, 18]
    batch = _ragged_batch(lengths, 64)
    parts = update.mini_batches(updater, batch, list(batch))
    seen = np.sort(np.concatenate([idx for idx, _ in parts]))
    np.testing.assert_array_equal(seen, np.arange(len(lengths)))  # every row exactly once
    groups = [sorted(np.asarray(lengths)[idx].tolist()) for idx, _ in parts]
    assert groups == [[33, 60, 61, 64], [5, 7, 18, 20]]
    assert [part["input_ids"].shape[1] for _, part in parts] == [64, 32]
    for idx, part in parts:
        np.testing.assert_array_equal(
            part["targets"], batch["targets"][idx, : part["targets"].shape[1]]
        )


def test_with_shared_prompts_mini_batches_keep_whole_groups(updater):
    lengths = [5, 60, 20, 61, 7, 33, 64, 18]  # groups of 2: longest rows 60, 61, 33, 64
    batch = _ragged_batch(lengths, 64)
    prompt_lengths = np.asarray([3, 40, 17, 9])
    batch["prompt_mask"] = np.arange(48)[None, :] < prompt_lengths[:, None]
    batch["prompt_ids"] = np.where(batch["prompt_mask"], 7 + np.arange(4)[:, None], 0).astype(
        np.int32
    )
    batch["prompt_positions"] = np.broadcast_to(np.arange(48, dtype=np.int32), (4, 48)).copy()
    parts = update.mini_batches(updater, batch, list(batch))
    assert [idx.tolist() for idx, _ in parts] == [[6, 7, 2, 3], [0, 1, 4, 5]]
    assert [part["input_ids"].shape[1] for _, part in parts] == [64, 64]
    # prompts of 9 and 40 tokens, then 3 and 17: each part padded to its own bucket of 16
    assert [part["prompt_mask"].shape for _, part in parts] == [(2, 48), (2, 32)]
    np.testing.assert_array_equal(parts[0][1]["prompt_ids"], batch["prompt_ids"][[3, 1]])
    np.testing.assert_array_equal(parts[1][1]["prompt_mask"], batch["prompt_mask"][[0, 2], :32])


@pytest.mark.parametrize(
    "tasks, accum, shards, shared",
    [(2, 1, 2, True), (2, 1, 4, False), (4, 2, 2, True), (3, 2, 1, False), (8, 2, 8, False)],
)
def test_prompts_are_shared_only_when_micro_batch_groups_split_over_the_shards(
    tasks, accum, shards, shared
):
    c = get_config()
    c.train.mini_batch_tasks, c.optim.grad_accum = tasks, accum
    assert update.can_share_prompt(c, shards) is shared
    c.train.share_prompt = False
    assert update.can_share_prompt(c, shards) is False
