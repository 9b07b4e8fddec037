"""The optax chain of config.optim against a NumPy re-derivation of clipped AdamW and schedules."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import NamedSharding, PartitionSpec

from configs.base import base_config
from seal_jax import optim


def config(**overrides):
    c = base_config().optim
    c.update(overrides)
    return c


def reference_lr(c, step):
    if step < c.warmup_steps:
        return c.lr * step / c.warmup_steps
    if c.schedule == "constant":
        return c.lr
    progress = (step - c.warmup_steps) / (c.total_steps - c.warmup_steps)
    progress = min(progress, 1.0)
    if c.schedule == "linear":
        return c.lr * (1 - progress)
    return c.lr * 0.5 * (1 + math.cos(math.pi * progress))


@pytest.mark.parametrize("schedule", ["constant", "cosine", "linear"])
@pytest.mark.parametrize("warmup", [0, 5])
def test_schedules_match_reference(schedule, warmup):
    c = config(lr=3e-4, schedule=schedule, warmup_steps=warmup, total_steps=20)
    lr = optim.make_schedule(c)
    for step in (0, 1, 4, 5, 6, 12, 19, 20, 30):
        assert float(lr(step)) == pytest.approx(reference_lr(c, step), rel=1e-5, abs=1e-12)


def reference_adamw(c, params, grads_per_step):
    """Clip by global norm, then AdamW with bias correction and decoupled, lr-scaled decay."""
    p = {k: np.asarray(v, np.float64) for k, v in params.items()}
    m = {k: np.zeros_like(v) for k, v in p.items()}
    v = {k: np.zeros_like(x) for k, x in p.items()}
    for t, grads in enumerate(grads_per_step, start=1):
        norm = math.sqrt(sum(float(np.sum(np.square(g))) for g in grads.values()))
        scale = min(1.0, c.grad_clip / norm) if c.grad_clip else 1.0
        lr = reference_lr(c, t - 1)
        for k in p:
            g = np.asarray(grads[k], np.float64) * scale
            m[k] = c.b1 * m[k] + (1 - c.b1) * g
            v[k] = c.b2 * v[k] + (1 - c.b2) * g * g
            m_hat, v_hat = m[k] / (1 - c.b1**t), v[k] / (1 - c.b2**t)
            p[k] = p[k] - lr * (m_hat / (np.sqrt(v_hat) + c.eps) + c.weight_decay * p[k])
    return p


def test_clipped_adamw_matches_reference():
    c = config(lr=0.1, weight_decay=0.05, grad_clip=1.0, schedule="linear", total_steps=10)
    rng = np.random.default_rng(0)
    params = {"a": jnp.asarray(rng.normal(size=(3, 4)), jnp.float32), "b": jnp.ones(5)}
    grads = [
        {k: rng.normal(size=v.shape).astype(np.float32) for k, v in params.items()}
        for _ in range(3)
    ]
    optimizer = optim.make_optimizer(c)
    state, got = optimizer.init(params), params
    for g in grads:
        updates, state = optimizer.update(g, state, got)
        got = optax.apply_updates(got, updates)
    expected = reference_adamw(c, params, grads)
    for k in params:  # float32 vs float64: Adam's m / sqrt(v) amplifies rounding when m cancels
        np.testing.assert_allclose(np.asarray(got[k]), expected[k], rtol=1e-5, atol=5e-6)


def test_accumulation_sums_micro_batch_gradients():
    c = config(lr=0.1, grad_accum=3, grad_clip=0.0)
    rng = np.random.default_rng(1)
    params = {"w": jnp.asarray(rng.normal(size=(4,)), jnp.float32)}
    micro = [{"w": rng.normal(size=4).astype(np.float32)} for _ in range(3)]
    optimizer = optim.make_optimizer(c)
    state, got = optimizer.init(params), params
    for g in micro:
        updates, state = optimizer.update(g, state, got)
        got = optax.apply_updates(got, updates)
    total = sum(g["w"] for g in micro)
    expected = reference_adamw(config(lr=0.1, grad_clip=0.0), params, [{"w": total}])
    np.testing.assert_allclose(np.asarray(got["w"]), expected["w"], rtol=1e-5, atol=1e-6)
    # Adam is scale-invariant, so only its first moment tells a sum from a mean.
    (mu,) = optax.tree_utils.tree_get_all_with_path(state, "mu")
    np.testing.assert_allclose(np.asarray(mu[1]["w"]), (1 - c.b1) * total, rtol=1e-6)


def test_opt_state_shardings_follow_params():
    mesh = jax.make_mesh((1,), ("fsdp",), axis_types=(jax.sharding.AxisType.Auto,))
    params = {"w": jax.ShapeDtypeStruct((4, 2), jnp.float32)}
    sharded = {"w": NamedSharding(mesh, PartitionSpec("fsdp"))}
    optimizer = optim.make_optimizer(config(grad_accum=2))
    shardings = optim.opt_state_shardings(optimizer, params, sharded)
    state = jax.eval_shape(optimizer.init, params)
    assert jax.tree.structure(shardings) == jax.tree.structure(state)
    specs = [s.spec for s in jax.tree.leaves(shardings)]
    assert specs.count(PartitionSpec("fsdp")) == 3  # Adam mu, nu and the accumulator
    assert set(specs) == {PartitionSpec("fsdp"), PartitionSpec()}


@pytest.mark.parametrize(
    "overrides",
    [
        dict(schedule="step"),
        dict(grad_accum=0),
        dict(schedule="cosine", warmup_steps=72, total_steps=72),
    ],
)
def test_bad_config_raises(overrides):
    with pytest.raises(ValueError):
        optim.make_optimizer(config(**overrides))
