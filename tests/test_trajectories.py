"""The update batch: next-token alignment, and dropping constant-reward groups
(rl.drop_constant_groups)."""

import jax.numpy as jnp
import numpy as np

from seal_jax import rl
from seal_jax.rollout import Episode
from seal_jax.trajectories import training_batch, update_rows


def test_batch_aligns_ids_masks_and_untempered_sampler_logprobs_to_targets():
    rng = np.random.default_rng(0)
    episodes = []
    for n in (5, 9):
        sampled = rng.random(n) < 0.5
        sampled[0] = False  # the first id is always prompt
        raw = np.where(sampled, -rng.random(n), 0).astype(np.float32)
        episodes.append(
            Episode(
                token_ids=rng.integers(1, 50, n).astype(np.int32),
                loss_mask=sampled,
                logprobs=np.where(sampled, raw - 1, 0).astype(np.float32),  # tempered: differ
                raw_logprobs=raw,
                prompt_len=1,
                num_turns=1,
                stop_reason="stop",
            )
        )
    batch = training_batch(episodes, np.asarray([0.5, -0.5], np.float32), length_multiple=4)
    assert batch["input_ids"].shape == (2, 12)  # 9 rounded up to a multiple of 4
    for row, ep in enumerate(episodes):
        n = len(ep.token_ids)
        # Position t predicts the id at t + 1: targets, loss mask and log-probs are shifted.
        np.testing.assert_array_equal(batch["input_ids"][row, :n], ep.token_ids)
        np.testing.assert_array_equal(batch["targets"][row, : n - 1], ep.token_ids[1:])
        np.testing.assert_array_equal(batch["loss_mask"][row, : n - 1], ep.loss_mask[1:])
        np.testing.assert_array_equal(batch["sampler_logprobs"][row, : n - 1], ep.raw_logprobs[1:])
        assert not batch["mask"][row, n:].any() and not batch["loss_mask"][row, n - 1 :].any()
        assert not batch["sampler_logprobs"][row, n - 1 :].any()


def test_keeps_groups_with_signal_and_pads_with_dropped_ones():
    # Five groups of two rows; groups 1, 3 and 4 have a non-zero advantage.
    adv = np.array([0, 0, 1, -1, 0, 0, 0.5, -0.5, -2, 2], np.float32)
    rows, trained = update_rows(adv, group_size=2, groups_per_mini_batch=2)
    # Live groups in order, then the first dropped group pads to two mini-batches of two.
    np.testing.assert_array_equal(rows, [2, 3, 6, 7, 8, 9, 0, 1])
    np.testing.assert_array_equal(trained, [True] * 6 + [False] * 2)


def test_no_padding_when_live_groups_fill_the_mini_batches():
    adv = np.array([1, -1, 0, 0, 1, -1, 0, 0], np.float32)
    rows, trained = update_rows(adv, group_size=2, groups_per_mini_batch=2)
    np.testing.assert_array_equal(rows, [0, 1, 4, 5])
    assert trained.all()


def test_no_group_with_signal_gives_an_empty_update():
    rows, trained = update_rows(np.zeros(8, np.float32), group_size=4, groups_per_mini_batch=1)
    assert rows.size == 0 and trained.size == 0


def test_masked_padding_leaves_the_loss_of_the_live_rows_unchanged():
    rng = np.random.default_rng(0)
    adv = np.array([0.0, 0.0, 1.0, -1.0], np.float32)  # group 0 constant, group 1 live
    logp = rng.normal(size=(4, 6)).astype(np.float32) - 2
    old = logp + rng.normal(scale=0.1, size=logp.shape).astype(np.float32)
    mask = rng.random(logp.shape) < 0.7
    rows, trained = update_rows(adv, group_size=2, groups_per_mini_batch=2)
    padded_mask = mask[rows] & trained[:, None]
    padded, _ = rl.policy_loss(
        jnp.asarray(logp[rows]),
        jnp.asarray(old[rows]),
        jnp.asarray(adv[rows]),
        jnp.asarray(padded_mask),
        kl_coef=0.0,
    )
    live, _ = rl.policy_loss(
        jnp.asarray(logp[2:]),
        jnp.asarray(old[2:]),
        jnp.asarray(adv[2:]),
        jnp.asarray(mask[2:]),
        kl_coef=0.0,
    )
    # NumPy token-mean over the live rows' tokens, unclipped where the ratio is inside 1 +- 0.2.
    ratio = np.exp(logp[2:] - old[2:])
    a = adv[2:, None]
    pg = np.maximum(-a * ratio, -a * np.clip(ratio, 0.8, 1.2))
    pg = np.where((a < 0) & (pg > -a * 10.0), -a * 10.0, pg)
    np.testing.assert_allclose(float(padded), float(live), rtol=1e-6)
    np.testing.assert_allclose(float(live), pg[mask[2:]].mean(), rtol=1e-5)
