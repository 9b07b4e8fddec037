"""Checkpoint retention (last K plus the best, old ones deleted after the new one is complete),
exact round trip, fallback past unreadable checkpoints, and refusals."""

import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from etils import epath

from seal_jax.checkpointing import Checkpointer, CheckpointMismatchError, UnreadableCheckpointError
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


def test_a_relative_work_directory_saves_and_restores(tmp_path, monkeypatch):
    """run.py's default work directories are relative (workdirs/...); orbax needs absolute ones."""
    monkeypatch.chdir(tmp_path)
    params, opt_state = _state()
    with Checkpointer("workdirs/run") as checkpointer:
        checkpointer.save(1, params, opt_state, {"step": 1}, 0.0)
        checkpointer.wait()
        restored, _, _ = checkpointer.restore(1, *_state())
    np.testing.assert_array_equal(np.asarray(restored["w"]), np.asarray(params["w"]))
    assert (tmp_path / "workdirs/run/checkpoints/1").is_dir()


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


def _saved(tmp_path, steps, **options):
    params, opt_state = _state()
    checkpointer = Checkpointer(str(tmp_path), **options)
    for step in steps:
        scaled = jax.tree.map(lambda x, s=step: x * s, params)
        checkpointer.save(step, scaled, opt_state, {"step": step}, float("-inf"))
    checkpointer.wait()
    return checkpointer


def _break(checkpoint, how):
    if how == "missing files":
        shutil.rmtree(checkpoint / "params")
    elif how == "bad json":
        (checkpoint / "host" / "metadata").write_text('{"step": 3')
    else:  # an item of the wrong shapes: the optimizer state's files hold the parameters
        shutil.rmtree(checkpoint / "opt_state")
        shutil.copytree(checkpoint / "params", checkpoint / "opt_state")


@pytest.mark.parametrize("how", ["missing files", "bad json", "shape mismatch"])
def test_an_unreadable_latest_checkpoint_is_reported_and_the_one_before_restored(
    tmp_path, how, caplog
):
    _saved(tmp_path, [1, 2, 3]).close()
    _break(tmp_path / "checkpoints" / "3", how)
    # Read-only (eval, export): the bad one is reported and kept.
    with Checkpointer(str(tmp_path), read_only=True) as reader:
        step, params, opt_state, host = reader.restore_latest(*_state())
    assert (step, host["step"]) == (2, 2)
    np.testing.assert_array_equal(np.asarray(params["w"]), 2 * np.arange(6.0).reshape(2, 3))
    assert os.path.isdir(tmp_path / "checkpoints" / "3")
    warnings = [r.getMessage() for r in caplog.records if "does not read back" in r.getMessage()]
    assert len(warnings) == 1 and "restored step 2" in warnings[0] and "3 kept" in warnings[0]
    # Training deletes it, since it writes that step again.
    with Checkpointer(str(tmp_path)) as checkpointer:
        step, *_ = checkpointer.restore_latest(*_state(), discard_unreadable=True)
        params, opt_state = _state()
        checkpointer.save(3, params, opt_state, {"step": 3}, 0.0)
    assert step == 2 and sorted(os.listdir(tmp_path / "checkpoints")) == ["1", "2", "3"]


def test_no_readable_checkpoint_is_one_error(tmp_path):
    _saved(tmp_path, [1]).close()
    _break(tmp_path / "checkpoints" / "1", "bad json")
    reader = Checkpointer(str(tmp_path), read_only=True)
    with pytest.raises(UnreadableCheckpointError, match="no checkpoint .* reads back"):
        reader.restore_latest(*_state())
    with Checkpointer(str(tmp_path / "empty"), read_only=True) as reader:
        assert reader.restore_latest(*_state()) is None


@pytest.mark.parametrize("asynchronous", [True, False])
def test_old_checkpoints_are_deleted_only_once_the_new_one_is_complete(tmp_path, asynchronous):
    """keep=1: saving step 2 drops step 1, but orbax deletes it only after step 2 is final
    (renamed from its temporary directory, every item written). The spy sits on orbax's
    deleter, the one place a step's files are removed."""
    checkpointer = _saved(tmp_path, [1], keep=1, asynchronous=asynchronous)
    deleter = checkpointer.manager._checkpoint_deleter
    seen = []

    def delete_steps(steps):
        final = tmp_path / "checkpoints" / "2"
        items = {"params", "opt_state", "host"}
        seen.append((list(steps), final.is_dir() and items <= set(os.listdir(final))))
        return original(steps)

    original, deleter.delete_steps = deleter.delete_steps, delete_steps
    params, opt_state = _state()
    blocked = checkpointer.save(2, params, opt_state, {"step": 2}, float("-inf"))
    checkpointer.close()
    assert blocked > 0 and seen == [([1], True)]
    assert sorted(os.listdir(tmp_path / "checkpoints")) == ["2"]


def test_the_directory_goes_through_epath(tmp_path):
    """The work directory is handed to orbax as an etils.epath path (what makes gs:// work),
    and the checkpoint reads back through the same route."""
    checkpointer = _saved(tmp_path, [1])
    assert isinstance(checkpointer.directory, epath.Path)
    assert str(checkpointer.directory) == str(tmp_path / "checkpoints")
    step, params, _, _ = checkpointer.restore_latest(*_state())
    assert step == 1 and np.asarray(params["w"]).tolist() == [[0, 1, 2], [3, 4, 5]]
    checkpointer.close()
