"""Checkpoint retention (last K plus the best), exact round trip, and refusals."""

import os

import jax.numpy as jnp
import numpy as np
import optax
import pytest

from seal_jax.checkpointing import Checkpointer, CheckpointMismatchError
from seal_jax.config import ConfigError
from seal_jax.trainer import eval_score


def _state():
    params = {"w": jnp.arange(6.0).reshape(2, 3), "b": {"c": jnp.ones(4)}}
    opt = optax.adamw(1e-3)
    return params, opt.init(params)


def test_keeps_the_last_k_and_the_best(tmp_path):
    params, opt_state = _state()
    checkpointer = Checkpointer(str(tmp_path), keep=2)
    scores = {1: 0.2, 2: 0.9, 3: None, 4: 0.1, 5: None}
    for step, score in scores.items():
        metric = float("-inf") if score is None else score
        checkpointer.save(step, params, opt_state, {"step": step}, metric)
    checkpointer.wait()
    assert sorted(int(d) for d in os.listdir(tmp_path / "checkpoints") if d.isdigit()) == [2, 4, 5]
    checkpointer.close()


def test_round_trip_is_exact_and_shapes_are_checked(tmp_path):
    params, opt_state = _state()
    params = {"w": params["w"] * 1.2345678, "b": params["b"]}
    checkpointer = Checkpointer(str(tmp_path))
    host = {"step": 7, "weighting": {"x": [1, 2]}, "interface": {"version": 3}}
    checkpointer.save(7, params, opt_state, host, 0.5)
    checkpointer.wait()
    restored, restored_opt, restored_host = checkpointer.restore(7, *_state())
    np.testing.assert_array_equal(np.asarray(restored["w"]), np.asarray(params["w"]))
    assert restored_host["weighting"] == host["weighting"]
    assert restored_host["interface"] == host["interface"]
    wrong = {"w": jnp.zeros((3, 3)), "b": {"c": jnp.ones(4)}}
    with pytest.raises(CheckpointMismatchError, match="parameter w has shape"):
        checkpointer.restore(7, wrong, optax.adamw(1e-3).init(wrong))
    checkpointer.close()


def test_best_metric_key():
    evaluation = {"mean": 0.25, "accuracy": {"base": 0.5, "miss_func": 0.0}}
    assert eval_score(evaluation, "eval/mean") == 0.25
    assert eval_score(evaluation, "eval/accuracy/base") == 0.5
    with pytest.raises(ConfigError, match="best_metric"):
        eval_score(evaluation, "eval/accuracy/nope")


def test_round_trip_keeps_host_memory_state(tmp_path):
    """Adam's state in host memory (optim.moments_on_host) is saved and restored exactly, and
    comes back in host memory."""
    from types import SimpleNamespace

    import jax

    from seal_jax import optim, sharding

    mesh = sharding.make_mesh(1, 1, 1, jax.devices()[:1])
    c = SimpleNamespace(
        lr=1e-3,
        schedule="constant",
        warmup_steps=0,
        total_steps=1,
        weight_decay=0.0,
        b1=0.9,
        b2=0.999,
        eps=1e-8,
        mu_dtype="float32",
        grad_clip=1.0,
        grad_accum=2,
        moments_on_host=True,
    )
    optimizer = optim.make_optimizer(c)
    params = {"w": jnp.arange(6.0).reshape(2, 3), "b": jnp.ones(4)}
    shardings = optim.opt_state_shardings(
        optimizer, params, jax.tree.map(lambda _: sharding.replicated(mesh), params)
    )
    state = jax.jit(optimizer.init, out_shardings=shardings)(params)
    state = jax.device_put(jax.tree.map(lambda x: x + 1, state), shardings)
    checkpointer = Checkpointer(str(tmp_path))
    checkpointer.save(3, params, state, {"step": 3}, 0.0)
    checkpointer.wait()
    template = jax.jit(optimizer.init, out_shardings=shardings)(params)
    _, restored, _ = checkpointer.restore(3, params, template)
    for got, want in zip(jax.tree.leaves(restored), jax.tree.leaves(state), strict=True):
        assert got.sharding.memory_kind == want.sharding.memory_kind
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    assert {x.sharding.memory_kind for x in jax.tree.leaves(restored.adam)} == {optim.HOST}
    checkpointer.close()
