"""Mini-batches of the update: rows taken longest first, each padded only to its own rows."""

import numpy as np
import pytest

from configs.tiny_test import get_config
from seal_jax import modes, trainer

VOCAB = 860  # below the suite tokenizer's vocabulary (suite_model's embedding rows)


@pytest.fixture(scope="module")
def run(suite_model, tmp_path_factory):
    c = get_config()
    c.model.path = suite_model
    c.train.mini_batch_tasks = 2
    c.rl.group_size = 2
    c.train.length_bucket = 16
    return trainer.build(c, modes.load_policy(c), str(tmp_path_factory.mktemp("work")))


def _ragged_batch(lengths, width):
    rng = np.random.default_rng(0)
    b = len(lengths)
    mask = np.arange(width)[None, :] < np.asarray(lengths)[:, None]
    ids = np.where(mask, rng.integers(2, VOCAB, (b, width)), 0).astype(np.int32)
    targets = np.where(mask, np.roll(ids, -1, axis=1), 0).astype(np.int32)
    positions = np.broadcast_to(np.arange(width, dtype=np.int32), (b, width)).copy()
    return {"input_ids": ids, "mask": mask, "targets": targets, "positions": positions}


def test_rows_are_grouped_by_length_and_padded_to_their_own_bucket(run):
    lengths = [5, 60, 20, 61, 7, 33, 64, 18]
    parts = trainer._mini_batches(run, _ragged_batch(lengths, 64))
    seen = np.sort(np.concatenate([idx for idx, _ in parts]))
    np.testing.assert_array_equal(seen, np.arange(len(lengths)))  # every row exactly once
    groups = [sorted(np.asarray(lengths)[idx].tolist()) for idx, _ in parts]
    assert groups == [[33, 60, 61, 64], [5, 7, 18, 20]]
    assert [length for _, length in parts] == [64, 32]


def test_forward_log_probs_equal_one_pass_over_the_whole_batch(run):
    batch = _ragged_batch([5, 60, 20, 61, 7, 33, 64, 18], 64)
    got = trainer._forward_logprobs(run, run.model.params, batch)
    full = np.asarray(run.logprob_fn(run.model.params, trainer._put(run, batch)))
    np.testing.assert_allclose(got[batch["mask"]], full[batch["mask"]], atol=1e-5)
