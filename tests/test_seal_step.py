"""One SEAL step in process: the wiring from episodes to the update, against a hand derivation.

The episodes are scripted (designed rewards and tags, token sequences on the tiny policy's
vocabulary), so every quantity between them and the optimizer is known: rewards, the failure
profile, utilities (re-derived by tests.test_weighting's independent reference), trajectory
weights, GRPO advantages, and which rows the update trains on.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs.tiny_test import get_config
from environments.episode import EpisodeResult
from seal_jax import episodes, modes, optim, trainer, trajectories
from seal_jax import update as update_lib
from seal_jax.rollout import STOP, TokenSequence
from tests.test_weighting import reference_update, reference_weight

# Three tasks, two rollouts each: group 0 and group 2 have one success, group 1 none.
TAGS = [
    ["pass", "pass"],
    ["state_mismatch", "pass"],
    ["spurious_tool_call"],
    ["instance_mismatch", "gt_error"],
    ["empty_turn_model_response"],
    ["pass"],
]
SUCCESS = [True, False, False, False, False, True]


def scripted_batch(task_ids, group_size):
    """An EpisodeBatch of the step's tasks: one shared prompt per task, a sampled reply each."""
    rng = np.random.default_rng(0)
    sequences, results = [], []
    for row, (tags, success) in enumerate(zip(TAGS, SUCCESS, strict=True)):
        task = task_ids[row // group_size]
        prompt = np.arange(5, 25, dtype=np.int32) + row // group_size
        reply = rng.integers(30, 800, 6 + row).astype(np.int32)
        ids = np.concatenate([prompt, reply])
        sampled = np.arange(len(ids)) >= len(prompt)
        logprobs = np.where(sampled, -2.0, 0.0).astype(np.float32)
        sequences.append(TokenSequence(ids, sampled, logprobs, logprobs, len(prompt), STOP))
        causes = [set() for _ in tags]
        results.append(EpisodeResult(task, "base", success, tags, causes, [[] for _ in tags]))
    return episodes.EpisodeBatch(sequences, results, {"generate_s": 1.0, "env_s": 0.0})


def grpo_reference(rewards, group_size, eps):
    out = []
    for group in np.asarray(rewards, np.float64).reshape(-1, group_size):
        if group.max() == group.min():
            out += [0.0] * group_size
        else:
            out += list((group - group.mean()) / (group.std(ddof=1) + eps))
    return np.asarray(out)


@pytest.fixture(scope="module")
def shared_run(suite_model, tmp_path_factory):
    """One build (engines, jitted update) for the tests that train with these settings, so that
    they compile its programs once: three tasks a step, one per optimizer step, groups without
    signal dropped, a KL term. (rl.reference_on_host is read where the reference is made,
    `update.frozen_reference`, not by the build.)"""
    c = get_config()
    c.model.path = suite_model
    c.env.name = "suite"
    c.train.batch_tasks, c.train.mini_batch_tasks = 3, 1
    c.rl.drop_constant_groups = True
    c.train.length_bucket = 16
    c.rl.kl_coef = 0.1
    return trainer.build(c, modes.load_policy(c), str(tmp_path_factory.mktemp("run")))


def fresh(run):
    """The run with a copy of the loaded parameters: an update donates the ones it is given."""
    params = jax.tree.map(jnp.copy, run.model.params)
    return dataclasses.replace(run, model=dataclasses.replace(run.model, params=params))


@pytest.fixture
def run(shared_run):
    return fresh(shared_run)


def test_one_step_weights_advantages_and_update_rows(run, monkeypatch):
    cfg = run.config
    seen = {}

    def collect(engine, params, chat, pool, *, task_ids, num_samples, seed, **kwargs):
        seen["tasks"], seen["seed"] = task_ids, seed
        return scripted_batch(task_ids, num_samples)

    def update(updater, params, opt_state, sequences, advantages, ref_params):
        seen["advantages"] = np.asarray(advantages)
        return real_update(updater, params, opt_state, sequences, advantages, ref_params)

    def batch(sequences, advantages, *args, **kwargs):
        seen["rows"] = [int(s.token_ids[20]) for s in sequences]  # first reply id, unique per row
        return real_batch(sequences, advantages, *args, **kwargs)

    real_update, real_batch = update_lib.update_policy, trajectories.training_batch
    monkeypatch.setattr(episodes, "collect_episodes", collect)
    monkeypatch.setattr(update_lib, "update_policy", update)
    monkeypatch.setattr(trajectories, "training_batch", batch)

    state = trainer.initial_state(run)
    before = trainer.checksum(state.params)
    ref = update_lib.frozen_reference(state.params, run.model.compute_dtype)
    metrics = trainer.train_one_step(run, state, pool=None, ref_params=ref)

    assert seen["tasks"] == trainer.step_tasks(cfg, run.source, 0) and state.step == 1
    assert seen["seed"] == cfg.seed * 1_000_003
    # Feedback: the profile and the utilities after one closed-loop step from rho0.
    rewards = [float(s) for s in SUCCESS]
    rho0 = dict(cfg.weighting.rho0)
    expected_rho = reference_update(rho0, list(zip(TAGS, rewards)), rho0)
    assert state.profile.tags.total_count["pass"] == 4
    assert state.weighting.utilities == pytest.approx(expected_rho, abs=1e-12)
    weights = np.asarray([reference_weight(tags, expected_rho) for tags in TAGS])
    np.testing.assert_allclose(metrics["weights"]["weight_mean"], weights.mean(), rtol=1e-6)
    np.testing.assert_allclose(metrics["trajectories"]["weight"], weights, rtol=1e-6)
    assert metrics["trajectories"]["tags"] == [list(tags) for tags in TAGS]
    assert state.interface.state.step == 1
    # Advantages: GRPO per task, times the weights; group 1 (no success) has none.
    advantages = grpo_reference(rewards, cfg.rl.group_size, cfg.rl.adv_eps) * weights
    np.testing.assert_allclose(seen["advantages"], advantages, rtol=1e-6)
    assert np.all(np.sign(seen["advantages"]) == [1, -1, 0, 0, -1, 1])
    # Update rows: groups 0 and 2 only (drop_constant_groups), one optimizer step each.
    expected_rows = [int(s.token_ids[20]) for s in scripted_batch(seen["tasks"], 2).sequences]
    assert seen["rows"] == [expected_rows[i] for i in (0, 1, 4, 5)]
    assert metrics["update_groups"] == 2 and metrics["zero_adv_group_fraction"] == pytest.approx(
        1 / 3
    )
    assert metrics["loss"]["loss_tokens"] > 0
    assert trainer.checksum(state.params) != before


def test_reference_on_host_gives_the_same_update(shared_run):
    """rl.reference_on_host keeps the reference in host memory between its passes and changes
    nothing else: the same parameters and loss metrics after an update with KL (every group
    has signal, so all rows train)."""

    def update(on_host):
        run = fresh(shared_run)
        c = run.config
        state = trainer.initial_state(run)
        ref = update_lib.frozen_reference(state.params, run.model.compute_dtype, on_host)
        batch = scripted_batch(trainer.step_tasks(c, run.source, 0), c.rl.group_size)
        advantages = np.linspace(-1, 1, len(batch.sequences)).astype(np.float32)
        params, _, metrics = update_lib.update_policy(
            run.updater, state.params, state.opt_state, batch.sequences, advantages, ref
        )
        return ref, params, metrics

    ref, params, metrics = update(True)
    assert {x.sharding.memory_kind for x in jax.tree.leaves(ref)} == {optim.HOST}
    _, want_params, want_metrics = update(False)
    assert metrics["loss"] == want_metrics["loss"]
    for got, want in zip(jax.tree.leaves(params), jax.tree.leaves(want_params), strict=True):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def test_moments_on_host_give_the_same_update(suite_model, tmp_path):
    """optim.moments_on_host keeps Adam's state in host memory and runs the optimizer step as a
    program of its own; the parameters and optimizer moments after two steps' updates are those
    of the one-program step (optax's MultiSteps chain), up to float32 rounding (the programs fuse
    differently): within a thousandth of the learning rate, each Adam step's size."""

    def update(on_host):
        c = get_config()
        c.model.path = suite_model
        c.env.name = "suite"
        c.train.batch_tasks, c.train.mini_batch_tasks, c.train.length_bucket = 3, 3, 16
        c.optim.lr, c.optim.grad_clip, c.optim.grad_accum = 1e-2, 0.5, 3
        c.optim.moments_on_host, c.rl.kl_coef = on_host, 0.0
        run = trainer.build(c, modes.load_policy(c), str(tmp_path / str(on_host)))
        state = trainer.initial_state(run)
        params, opt_state = state.params, state.opt_state
        for step in range(2):
            batch = scripted_batch(trainer.step_tasks(c, run.source, step), c.rl.group_size)
            advantages = np.linspace(-1, 1, len(batch.sequences)).astype(np.float32)
            params, opt_state, _ = update_lib.update_policy(
                run.updater, params, opt_state, batch.sequences, advantages
            )
        return params, opt_state

    params, opt_state = update(True)
    moments = [x for adam in opt_state.adam for x in jax.tree.leaves(adam) if x.ndim]
    assert {x.sharding.memory_kind for x in moments} == {optim.HOST}
    want_params, want_state = update(False)
    want_adam = want_state.inner_opt_state[1][0]  # MultiSteps(chain(clip, adamw)): adam
    for got, want in zip(jax.tree.leaves(params), jax.tree.leaves(want_params), strict=True):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=0, atol=1e-5)
    got_mu = [adam[0].mu for adam in opt_state.adam]
    for got, want in zip(got_mu, jax.tree.leaves(want_adam.mu), strict=True):
        want = np.asarray(want)
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
