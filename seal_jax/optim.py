"""The optimizer, built from `config.optim`: global-norm clipping, then AdamW on a schedule.

AdamW's weight decay is decoupled and scaled by the learning rate (`p -= lr * (adam + wd * p)`,
as in PyTorch's AdamW) and applies to every parameter. Schedules rise linearly from 0 over
`warmup_steps`, then stay constant, or decay to 0 at `total_steps` (cosine or linear).

Gradient accumulation (`grad_accum > 1`) wraps the chain in `optax.MultiSteps` with summed, not
averaged, gradients: each micro-batch's loss is already divided by the whole step batch's
normaliser (`seal_jax.train_step.split_micro_batches`), so the sum is the step's gradient, and
clipping and the Adam update see exactly that gradient once per `grad_accum` calls.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import optax
from jax.sharding import NamedSharding, PartitionSpec

SCHEDULES = ("constant", "cosine", "linear")


def make_schedule(optim_config: Any) -> optax.Schedule:
    """Returns the learning rate as a function of the optimizer step (see the module docstring)."""
    c = optim_config
    if c.schedule not in SCHEDULES:
        raise ValueError(f"unknown optim.schedule {c.schedule!r}; expected one of {SCHEDULES}")
    if c.warmup_steps < 0 or (c.schedule != "constant" and c.warmup_steps >= c.total_steps):
        raise ValueError(
            f"need 0 <= warmup_steps < total_steps; got {c.warmup_steps}, {c.total_steps}"
        )
    decay_steps = c.total_steps - c.warmup_steps
    if c.schedule == "cosine":
        after_warmup = optax.cosine_decay_schedule(c.lr, decay_steps)
    elif c.schedule == "constant":
        after_warmup = optax.constant_schedule(c.lr)
    else:
        after_warmup = optax.linear_schedule(c.lr, 0.0, decay_steps)
    if c.warmup_steps == 0:
        return after_warmup
    warmup = optax.linear_schedule(0.0, c.lr, c.warmup_steps)
    return optax.join_schedules([warmup, after_warmup], [c.warmup_steps])


def make_optimizer(optim_config: Any) -> optax.GradientTransformation:
    """Returns the optax chain of `config.optim`, wrapped for gradient accumulation if asked."""
    c = optim_config
    if c.grad_accum < 1 or c.grad_clip < 0:
        raise ValueError(f"need grad_accum >= 1, grad_clip >= 0; got {c.grad_accum}, {c.grad_clip}")
    adamw = optax.adamw(
        make_schedule(c),
        b1=c.b1,
        b2=c.b2,
        eps=c.eps,
        weight_decay=c.weight_decay,
        mu_dtype=jnp.dtype(c.mu_dtype),  # "float32" | "bfloat16"
    )
    optimizer = optax.chain(optax.clip_by_global_norm(c.grad_clip), adamw) if c.grad_clip else adamw
    if c.grad_accum == 1:
        return optimizer
    return optax.MultiSteps(optimizer, c.grad_accum, use_grad_mean=False).gradient_transformation()


def opt_state_shardings(
    optimizer: optax.GradientTransformation, params: Any, param_shardings: Any
) -> Any:
    """Shardings for `optimizer.init(params)`: parameter-shaped parts follow `param_shardings`.

    params may be arrays or `jax.ShapeDtypeStruct`s; scalars such as step counts are replicated.
    """
    mesh = jax.tree.leaves(param_shardings)[0].mesh
    replicated = NamedSharding(mesh, PartitionSpec())
    abstract_state = jax.eval_shape(optimizer.init, params)
    return optax.tree_map_params(
        optimizer,
        lambda _, sharding: sharding,
        abstract_state,
        param_shardings,
        transform_non_params=lambda _: replicated,
    )
