"""The jitted, sharded training step and the split of a step batch into micro-batches.

`make_train_step(loss_fn, optimizer, ...)` compiles `(params, opt_state, batch) -> (params,
opt_state, metrics)` with explicit in/out shardings, donating params and optimizer state.
Gradient accumulation is `optax.MultiSteps` summing gradients (`seal_jax.optim`): call the step
once per micro-batch from `split_micro_batches`, whose rows all carry the step batch's loss
normaliser, so the summed micro-batch gradients equal the full batch's gradient (see
`seal_jax.rl` for the aggregation). With Adam's state in host memory
(`seal_jax.optim.HostMomentsOptimizer`) the step is two programs, `AccumulatingStep`. The batch
layout is the one documented in `seal_jax.rl`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import jax
import numpy as np
import optax
from jax.sharding import NamedSharding, PartitionSpec

from seal_jax import optim, sharding
from seal_jax.rl import PROMPT_KEYS, loss_normalizer

LossFn = Callable[[Any, Mapping[str, jax.Array]], tuple[jax.Array, dict[str, jax.Array]]]
TrainStep = Callable[[Any, Any, Mapping[str, jax.Array]], tuple[Any, Any, dict[str, jax.Array]]]


def split_micro_batches(
    batch: Mapping[str, np.ndarray], num_micro_batches: int, loss_agg: str
) -> list[dict[str, np.ndarray]]:
    """Splits a step batch (host arrays, leading dim B) into equal micro-batches of whole rows.

    Every row first gets `loss_norm`, the normaliser of the whole step batch, so that the losses
    and gradients of the micro-batches add up to those of the full batch. Shared prompts ([G, P],
    `seal_jax.rl.PROMPT_KEYS`) are split alike, so each micro-batch keeps whole groups.
    """
    rows = len(batch["loss_mask"])
    groups = len(batch[PROMPT_KEYS[0]]) if PROMPT_KEYS[0] in batch else rows
    if num_micro_batches < 1 or rows % num_micro_batches or groups % num_micro_batches:
        raise ValueError(
            f"cannot split {rows} rows ({groups} prompts) into {num_micro_batches} equal "
            "micro-batches"
        )
    norm = np.float32(loss_normalizer(np.asarray(batch["loss_mask"]), loss_agg))
    full = {**batch, "loss_norm": np.full((rows,), norm, dtype=np.float32)}
    parts = {key: np.split(value, num_micro_batches) for key, value in full.items()}
    return [{key: parts[key][i] for key in parts} for i in range(num_micro_batches)]


def make_train_step(
    loss_fn: LossFn,
    optimizer: optax.GradientTransformation,
    param_shardings: Any,
    batch_sharding: NamedSharding,
    opt_state_shardings: Any,
) -> TrainStep:
    """Returns the jitted `train_step(params, opt_state, batch) -> (params, opt_state, metrics)`.

    param_shardings / opt_state_shardings: pytrees of shardings matching params and optimizer state
    (`seal_jax.optim.opt_state_shardings`); batch_sharding: one sharding applied to every batch
    array (rows over the data axes). Metrics (the loss's, plus `loss` and `grad_norm` of this
    call's gradient, a micro-batch's share under accumulation) come back replicated. Params and
    optimizer state are donated: do not reuse the arrays passed in.
    """
    replicated = NamedSharding(batch_sharding.mesh, PartitionSpec())

    def train_step(params: Any, opt_state: Any, batch: Mapping[str, jax.Array]) -> tuple:
        (loss, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, batch)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        return params, opt_state, {**metrics, "loss": loss, "grad_norm": optax.global_norm(grads)}

    return jax.jit(
        train_step,
        in_shardings=(param_shardings, opt_state_shardings, batch_sharding),
        out_shardings=(param_shardings, opt_state_shardings, replicated),
        donate_argnums=(0, 1),
    )


@dataclasses.dataclass(frozen=True)
class AccumulatingStep:
    """A train step of two programs, for `seal_jax.optim.HostMomentsOptimizer`: every call runs
    `micro_step` (`(params, state, batch) -> (state, metrics)`: the gradient added to the state's
    sum, state donated), and every `grad_accum`-th call then `optimizer_step` (`(params, state)
    -> (params, state)`, both donated). Called like the one-program step."""

    micro_step: Any
    optimizer_step: Any
    grad_accum: int

    def __call__(self, params: Any, state: Any, batch: Mapping[str, jax.Array]) -> tuple:
        """One micro-step, then the optimizer step when it completes one: (params, state,
        metrics)."""
        state, metrics = self.micro_step(params, state, batch)
        if int(state.mini_step) == self.grad_accum:
            params, state = self.optimizer_step(params, state)
        return params, state, metrics


def make_accumulating_step(
    loss_fn: LossFn,
    optimizer: optim.HostMomentsOptimizer,
    param_shardings: Any,
    batch_sharding: NamedSharding,
    state_shardings: optim.HostMomentsState,
) -> AccumulatingStep:
    """The `AccumulatingStep` of loss_fn under optimizer; shardings as in `make_train_step`."""
    replicated = NamedSharding(batch_sharding.mesh, PartitionSpec())

    def micro_step(params: Any, state: Any, batch: Mapping[str, jax.Array]) -> tuple:
        (loss, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, batch)
        metrics = {**metrics, "loss": loss, "grad_norm": optax.global_norm(grads)}
        return optimizer.accumulate(grads, state), metrics

    micro = jax.jit(
        micro_step,
        in_shardings=(param_shardings, state_shardings, batch_sharding),
        out_shardings=(state_shardings, replicated),
        donate_argnums=(1,),
    )
    apply = jax.jit(
        lambda params, state: optimizer.step(params, state, state_shardings),
        in_shardings=(param_shardings, state_shardings),
        out_shardings=(param_shardings, state_shardings),
        donate_argnums=(0, 1),
    )
    return AccumulatingStep(micro, apply, optimizer.grad_accum)


def make_update_step(
    loss_fn: LossFn,
    optimizer: optax.GradientTransformation | optim.HostMomentsOptimizer,
    params: Any,
    mesh: Any,
) -> tuple[TrainStep, Callable[[Any], Any]]:
    """The jitted train step for parameters laid out as `params` are (batches over the mesh's
    batch axes), and `init(params) -> optimizer state` sharded alike
    (`seal_jax.optim.opt_state_shardings`). Returns (train_step, init)."""
    param_shardings = jax.tree.map(lambda x: x.sharding, params)
    state_shardings = optim.opt_state_shardings(optimizer, params, param_shardings)
    make = (
        make_accumulating_step
        if isinstance(optimizer, optim.HostMomentsOptimizer)
        else make_train_step
    )
    step_fn = make(
        loss_fn, optimizer, param_shardings, sharding.batch_sharding(mesh, ndim=1), state_shardings
    )
    init_fn = jax.jit(optimizer.init, out_shardings=state_shardings)

    def init(params: Any) -> Any:
        with jax.set_mesh(mesh):
            return init_fn(params)

    return step_fn, init
