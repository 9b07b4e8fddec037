"""The optimizer, built from `config.optim`: global-norm clipping, then AdamW on a schedule.

AdamW's weight decay is decoupled and scaled by the learning rate (`p -= lr * (adam + wd * p)`,
as in PyTorch's AdamW) and applies to every parameter. Schedules rise linearly from 0 over
`warmup_steps`, then stay constant, or decay to 0 at `total_steps` (cosine or linear).

Gradient accumulation (`grad_accum > 1`) wraps the chain in `optax.MultiSteps` with summed, not
averaged, gradients: each micro-batch's loss is already divided by the whole step batch's
normaliser (`seal_jax.train_step.split_micro_batches`), so the sum is the step's gradient, and
clipping and the Adam update see exactly that gradient once per `grad_accum` calls.

`optim.moments_on_host` keeps Adam's state in host memory instead (`HostMomentsOptimizer`): the
micro-steps only add their gradient to a sum on the chips, and the optimizer step is a program of
its own that brings the moments to the chips one parameter at a time, updates that parameter, and
sends them back. Its numbers are those of the chain above.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

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


HOST = "pinned_host"  # the memory kind of host-resident arrays


def make_optimizer(optim_config: Any) -> optax.GradientTransformation | HostMomentsOptimizer:
    """Returns the optax chain of `config.optim`, wrapped for gradient accumulation if asked, or
    with `moments_on_host` the `HostMomentsOptimizer` of the same settings."""
    c = optim_config
    if c.grad_accum < 1 or c.grad_clip < 0:
        raise ValueError(f"need grad_accum >= 1, grad_clip >= 0; got {c.grad_accum}, {c.grad_clip}")
    adamw = _adamw(c)
    if c.moments_on_host:
        return HostMomentsOptimizer(adamw, c.grad_clip, c.grad_accum)
    optimizer = optax.chain(optax.clip_by_global_norm(c.grad_clip), adamw) if c.grad_clip else adamw
    if c.grad_accum == 1:
        return optimizer
    return optax.MultiSteps(optimizer, c.grad_accum, use_grad_mean=False).gradient_transformation()


def _adamw(c: Any) -> optax.GradientTransformation:
    return optax.adamw(
        make_schedule(c),
        b1=c.b1,
        b2=c.b2,
        eps=c.eps,
        weight_decay=c.weight_decay,
        mu_dtype=jnp.dtype(c.mu_dtype),  # "float32" | "bfloat16"
    )


class HostMomentsState(NamedTuple):
    """The state of `HostMomentsOptimizer`.

    Attributes:
      acc_grads: the summed gradients of this optimizer step's micro-steps so far (on the chips).
      mini_step: int32 scalar, micro-steps since the last optimizer step.
      adam: one AdamW state per parameter (in the order of `jax.tree.leaves(params)`), in host
        memory.
    """

    acc_grads: Any
    mini_step: jax.Array
    adam: tuple


@dataclasses.dataclass(frozen=True)
class HostMomentsOptimizer:
    """Clipping and AdamW with Adam's state in host memory, over summed micro-step gradients.

    `accumulate` runs in every micro-step; `step` (the optimizer step, once per `grad_accum`
    micro-steps) clips the summed gradient by its global norm, then for one parameter at a time
    brings its moments to the chips, applies AdamW and sends them back, so the chips never hold
    more than one parameter's moments. Each parameter's AdamW state is the optax one of a
    one-parameter tree, so the update is the chain's, value for value.
    """

    adamw: optax.GradientTransformation
    grad_clip: float
    grad_accum: int

    def init(self, params: Any) -> HostMomentsState:
        """Zero accumulated gradients and fresh AdamW states for params."""
        adam = tuple(self.adamw.init(p) for p in jax.tree.leaves(params))
        acc = jax.tree.map(jnp.zeros_like, params)
        return HostMomentsState(acc, jnp.zeros((), jnp.int32), adam)

    def accumulate(self, grads: Any, state: HostMomentsState) -> HostMomentsState:
        """state with a micro-step's gradient added."""
        acc = jax.tree.map(jnp.add, state.acc_grads, grads)
        return state._replace(acc_grads=acc, mini_step=state.mini_step + 1)

    def step(
        self, params: Any, state: HostMomentsState, state_shardings: HostMomentsState
    ) -> tuple[Any, HostMomentsState]:
        """The optimizer step: (new params, state with zero accumulated gradients).

        state_shardings: the state's shardings (`opt_state_shardings`), whose AdamW parts name
        host memory; this function runs under jit."""
        leaves, treedef = jax.tree.flatten(params)
        grads = treedef.flatten_up_to(state.acc_grads)
        norm = optax.tree.norm(state.acc_grads)
        new_params, new_adam, done = [], [], None
        for p, g, adam, on_host in zip(leaves, grads, state.adam, state_shardings.adam):
            if done is not None:  # this parameter's moments move in after the last one is done
                adam, _ = jax.lax.optimization_barrier((adam, done))
            adam = jax.device_put(adam, jax.tree.map(_on_chips, on_host))
            updates, adam = self.adamw.update(self._clip(g, norm), adam, p)
            done = optax.apply_updates(p, updates)
            new_params.append(done)
            new_adam.append(jax.device_put(adam, on_host))
        acc = jax.tree.map(jnp.zeros_like, state.acc_grads)
        step = jnp.zeros_like(state.mini_step)
        return treedef.unflatten(new_params), HostMomentsState(acc, step, tuple(new_adam))

    def _clip(self, grad: jax.Array, norm: jax.Array) -> jax.Array:
        """One parameter's gradient clipped by the global norm, as optax.clip_by_global_norm."""
        if not self.grad_clip:
            return grad
        scaled = (grad / norm.astype(grad.dtype)) * self.grad_clip
        return jax.lax.select(norm < self.grad_clip, grad, scaled)

    def shardings(self, params: Any, param_shardings: Any) -> HostMomentsState:
        """The state's shardings: accumulated gradients as the parameters, each AdamW state's
        moments as its parameter in host memory, scalars replicated (counts in host memory)."""
        mesh = jax.tree.leaves(param_shardings)[0].mesh
        replicated = NamedSharding(mesh, PartitionSpec())
        adam = []
        for p, sharding in zip(jax.tree.leaves(params), jax.tree.leaves(param_shardings)):
            abstract = jax.eval_shape(self.adamw.init, p)
            adam.append(
                optax.tree_map_params(
                    self.adamw,
                    lambda _, s: s.with_memory_kind(HOST),
                    abstract,
                    sharding,
                    transform_non_params=lambda _: replicated.with_memory_kind(HOST),
                )
            )
        return HostMomentsState(param_shardings, replicated, tuple(adam))


def _on_chips(sharding: NamedSharding) -> NamedSharding:
    return sharding.with_memory_kind("device")


def opt_state_shardings(
    optimizer: optax.GradientTransformation | HostMomentsOptimizer,
    params: Any,
    param_shardings: Any,
) -> Any:
    """Shardings for `optimizer.init(params)`: parameter-shaped parts follow `param_shardings`.

    params may be arrays or `jax.ShapeDtypeStruct`s; scalars such as step counts are replicated.
    """
    if isinstance(optimizer, HostMomentsOptimizer):
        return optimizer.shardings(params, param_shardings)
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
