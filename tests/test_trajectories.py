"""The update batch: next-token alignment, and dropping constant-reward groups
(rl.drop_constant_groups)."""

import jax.numpy as jnp
import numpy as np
import pytest

from seal_jax import rl
from seal_jax.rollout import TokenSequence
from seal_jax.trajectories import training_batch, update_rows


def test_batch_aligns_ids_masks_and_untempered_rollout_logprobs_to_targets():
    rng = np.random.default_rng(0)
    episodes = []
    for n in (5, 9):
        sampled = rng.random(n) < 0.5
        sampled[0] = False  # the first id is always prompt
        raw = np.where(sampled, -rng.random(n), 0).astype(np.float32)
        episodes.append(
            TokenSequence(
                token_ids=rng.integers(1, 50, n).astype(np.int32),
                loss_mask=sampled,
                sampling_logprobs=np.where(sampled, raw - 1, 0).astype(np.float32),  # tempered
                policy_logprobs=raw,
                prompt_len=1,
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
        np.testing.assert_array_equal(
            batch["rollout_logprobs"][row, : n - 1], ep.policy_logprobs[1:]
        )
        assert not batch["mask"][row, n:].any() and not batch["loss_mask"][row, n - 1 :].any()
        assert not batch["rollout_logprobs"][row, n - 1 :].any()


def _episode(rng, prompt, n_after):
    sampled = np.concatenate([np.zeros(len(prompt), bool), rng.random(n_after) < 0.6])
    ids = np.concatenate([prompt, rng.integers(1, 50, n_after)]).astype(np.int32)
    raw = np.where(sampled, -rng.random(len(ids)), 0).astype(np.float32)
    return TokenSequence(ids, sampled, raw, raw, len(prompt), "stop")


def test_shared_prompt_batch_holds_each_prompt_once_and_the_same_loss_tokens():
    rng = np.random.default_rng(1)
    prompts = [rng.integers(1, 50, 6), rng.integers(1, 50, 3)]
    episodes = [_episode(rng, prompts[g], n) for g, n in ((0, 4), (0, 7), (1, 2), (1, 9))]
    adv = np.asarray([1, -1, 0.5, -0.5], np.float32)
    whole = training_batch(episodes, adv, length_multiple=4)
    shared = training_batch(episodes, adv, length_multiple=4, group_size=2)
    assert shared["prompt_ids"].shape == (2, 8) and shared["input_ids"].shape == (4, 12)
    for g, prompt in enumerate(prompts):
        p = len(prompt) - 1  # the prompt's last id starts every row of the group
        np.testing.assert_array_equal(shared["prompt_ids"][g, :p], prompt[:-1])
        np.testing.assert_array_equal(shared["prompt_mask"][g], np.arange(8) < p)
    for row, ep in enumerate(episodes):
        start, n = ep.prompt_len - 1, len(ep.token_ids) - ep.prompt_len + 1
        np.testing.assert_array_equal(shared["input_ids"][row, :n], ep.token_ids[start:])
        np.testing.assert_array_equal(shared["positions"][row, :n], start + np.arange(n))
        assert not shared["mask"][row, n:].any()
        for key in ("targets", "loss_mask", "rollout_logprobs"):
            np.testing.assert_array_equal(
                shared[key][row, : n - 1], whole[key][row, start : start + n - 1], err_msg=key
            )
    assert shared["loss_mask"].sum() == whole["loss_mask"].sum()


def test_rows_of_a_group_with_different_prompts_are_an_error():
    rng = np.random.default_rng(2)
    episodes = [_episode(rng, rng.integers(1, 50, 4), 3) for _ in range(2)]
    with pytest.raises(ValueError, match="do not share their prompt"):
        training_batch(episodes, np.zeros(2, np.float32), length_multiple=4, group_size=2)


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
