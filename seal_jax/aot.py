"""Ahead-of-time compilation of a run's device programs, with no weights and no data.

Every program is lowered from `jax.ShapeDtypeStruct`s that carry the run's shardings and compiled
for the mesh's devices: the local ones, or the abstract devices of a TPU topology
(`jax.experimental.topologies`, which needs libtpu but no chip). The compiled program's
`memory_analysis()` gives per-device argument and temporary bytes; its optimized HLO shows the
collectives. `run.py --mode=compile` (seal_jax.modes) reports them against the chip's memory.
"""

from __future__ import annotations

import collections
import dataclasses
import re
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import Mesh

from seal_jax import optim, sharding
from seal_jax import update as update_lib
from seal_jax.models import LoadedModel, QwenConfig
from seal_jax.models.checkpoint import param_shapes

# Batch arrays of one update micro-step (the layout of seal_jax.rl), without a shared prompt.
_UPDATE_BATCH = {
    "input_ids": jnp.int32,
    "positions": jnp.int32,
    "mask": jnp.bool_,
    "targets": jnp.int32,
    "loss_mask": jnp.bool_,
    "old_logprobs": jnp.float32,
    "ref_logprobs": jnp.float32,
}


@dataclasses.dataclass(frozen=True)
class ProgramMemory:
    """Bytes per device of one compiled program: its arguments, outputs not aliased to an
    argument, and temporaries."""

    name: str
    argument_bytes: int
    output_bytes: int
    temp_bytes: int

    @property
    def peak_bytes(self) -> int:
        """Arguments, temporaries and fresh outputs alive together at most."""
        return self.argument_bytes + self.temp_bytes + self.output_bytes


def abstract_model(
    cfg: QwenConfig, mesh: Mesh, param_dtype: Any, compute_dtype: Any
) -> LoadedModel:
    """A LoadedModel whose params are ShapeDtypeStructs with the training shardings."""
    shapes = param_shapes(cfg, param_dtype)
    shards = sharding.param_shardings(shapes, mesh)
    params = jax.tree.map(
        lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh), shapes, shards
    )
    return LoadedModel(cfg, params, mesh, "", compute_dtype)


def update_batch_rows(config: Any) -> int:
    """Rows of one update micro-step: train.mini_batch_tasks x rl.group_size / optim.grad_accum."""
    return config.train.mini_batch_tasks * config.rl.group_size // config.optim.grad_accum


def compile_update(config: Any, model: LoadedModel, length: int) -> jax.stages.Compiled:
    """The update micro-step at its largest shape (rows of `length` tokens each, whole
    sequences), compiled for the model's mesh."""
    updater = update_lib.build_updater(config, model)
    params = model.params
    shards = optim.opt_state_shardings(
        updater.optimizer, params, jax.tree.map(lambda x: x.sharding, params)
    )
    state = jax.tree.map(
        lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh),
        jax.eval_shape(updater.optimizer.init, params),
        shards,
    )
    batch = _batch(model.mesh, update_batch_rows(config), length, config.rl.kl_coef > 0)
    with jax.set_mesh(model.mesh):
        return updater.step_fn.lower(params, state, batch).compile()


def compile_logprobs(config: Any, model: LoadedModel, length: int) -> jax.stages.Compiled:
    """The old / reference log-prob pass over one mini-batch, compiled for the model's mesh."""
    updater = update_lib.build_updater(config, model)
    rows = config.train.mini_batch_tasks * config.rl.group_size
    batch = _batch(model.mesh, rows, length, with_ref=False)
    keys = ("input_ids", "positions", "mask", "targets")
    with jax.set_mesh(model.mesh):
        return updater.logprob_fn.lower(model.params, {k: batch[k] for k in keys}).compile()


def _batch(mesh: Mesh, rows: int, length: int, with_ref: bool) -> dict[str, Any]:
    """Abstract batch arrays [rows, length] and [rows] (advantages, loss_norm), rows over the
    batch axes."""
    rows_2d, rows_1d = sharding.batch_sharding(mesh, 2), sharding.batch_sharding(mesh, 1)
    batch = {
        name: jax.ShapeDtypeStruct((rows, length), dtype, sharding=rows_2d)
        for name, dtype in _UPDATE_BATCH.items()
        if with_ref or name != "ref_logprobs"
    }
    for name in ("advantages", "loss_norm"):
        batch[name] = jax.ShapeDtypeStruct((rows,), jnp.float32, sharding=rows_1d)
    return batch


def memory(name: str, compiled: jax.stages.Compiled) -> ProgramMemory:
    """Per-device bytes of a compiled program (`ProgramMemory`)."""
    m = compiled.memory_analysis()
    fresh_outputs = max(m.output_size_in_bytes - m.alias_size_in_bytes, 0)
    return ProgramMemory(name, m.argument_size_in_bytes, fresh_outputs, m.temp_size_in_bytes)


def collectives(hlo_text: str) -> collections.Counter:
    """(op, result shape) -> count of the all-gathers, all-reduces and reduce-scatters in an
    optimized HLO module (`compiled.as_text()`)."""
    pattern = (
        r"= ((?:bf16|f32|f16|s32|u32|pred)\[[\d,]*\])\S* (all-gather|all-reduce|reduce-scatter)"
    )
    return collections.Counter(
        (op, shape) for shape, op in re.findall(pattern + r"(?:-start)?\(", hlo_text)
    )
