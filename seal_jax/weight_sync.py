"""The sampling copy: the trainer's parameters laid out for decoding, made chip to chip.

The trainer keeps fp32 master weights fully sharded (FSDP) over every chip. Decoding from that
layout gathers every weight for every generated token. So before a step's rollouts the
parameters are copied into the compute dtype and a sampling layout: tensor-parallel over groups
of `rollout.sampler_tensor` chips (heads, MLP width and vocabulary split as `seal_jax.sharding`'s
rules split them over the `tensor` axis), replicated across the groups, each group decoding its
share of the rows. The copy is one compiled program (XLA's collectives between chips, no host
round trip), after the trainer's shards are moved, one shard per chip, onto the sampling mesh's
order of the chips (the trainer's mesh orders them for its rings, which interleave hosts); the
copy is dropped after the rollouts, so it costs memory only while they run.

Rollouts are host-local (`seal_jax.distributed`): the copy's global mesh stacks every process's
groups on the `data` axis, and each process then views the shards on its own chips as an array
on its local mesh (no gather, no host copy).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding

from seal_jax import config as config_lib
from seal_jax import sharding


@dataclasses.dataclass(frozen=True)
class SamplingLayout:
    """Where the rollout engine's copy of the parameters lives.

    Attributes:
      mesh: the engine's mesh, this process's devices: (data=groups, fsdp=1, tensor=group size).
      global_mesh: every process's `mesh` stacked on the data axis (the copy program's output).
      dtype: the copy's dtype (the compute dtype).
    """

    mesh: Mesh
    global_mesh: Mesh
    dtype: Any

    def shardings(self, params: Any, mesh: Mesh | None = None) -> Any:
        """The copy's shardings of params (arrays or ShapeDtypeStructs) on mesh (default: the
        global mesh)."""
        return sharding.param_shardings(params, mesh or self.global_mesh)

    def staged(self, params: Any) -> Any:
        """The shardings of params (arrays or ShapeDtypeStructs) with their own specs on their
        mesh's shape, over the global mesh's order of the chips (the copy program's input)."""

        def restage(x: Any) -> NamedSharding:
            mesh = x.sharding.mesh
            devices = self.global_mesh.devices.reshape(mesh.devices.shape)
            return NamedSharding(
                Mesh(devices, mesh.axis_names, axis_types=mesh.axis_types), x.sharding.spec
            )

        return jax.tree.map(restage, params)

    def copy_program(self, params: Any) -> Any:
        """The jitted copy `staged params -> copy on the global mesh`."""
        cast = lambda p: jax.tree.map(lambda x: x.astype(self.dtype), p)  # noqa: E731
        return jax.jit(cast, out_shardings=self.shardings(params))

    def copy(self, params: Any) -> Any:
        """The sampling copy of params (the trainer's, any layout) on this process's mesh."""
        params = jax.device_put(params, self.staged(params))  # a permutation of the shards
        with jax.set_mesh(self.global_mesh):
            copied = self.copy_program(params)(params)
        if jax.process_count() == 1:
            return copied
        return jax.tree.map(self._local_view, copied, self.shardings(copied, self.mesh))

    def _local_view(self, x: jax.Array, local: NamedSharding) -> jax.Array:
        """x's shards on this process's chips as one array on the local mesh (the copy is
        replicated across groups, so each process's shards hold the whole value)."""
        shards = {s.device: s.data for s in x.addressable_shards}
        return jax.make_array_from_single_device_arrays(
            x.shape, local, [shards[d] for d in local.addressable_devices_indices_map(x.shape)]
        )


def sampling_layout(
    tensor: int, compute_dtype: Any, devices: list[Any] | None = None
) -> SamplingLayout | None:
    """The layout of `rollout.sampler_tensor` (chips per group; 0: none on one process, where
    the engine reads the trainer's parameters, one group per host on several) over devices
    (default: all; grouped by process), or None.

    Raises:
      ConfigError: the group size does not divide the chips of a process.
    """
    devices = list(devices if devices is not None else jax.devices())
    processes = sorted({d.process_index for d in devices})
    per_process = [[d for d in devices if d.process_index == p] for p in processes]
    if tensor == 0 and len(processes) == 1:
        return None
    tensor = tensor or len(per_process[0])
    if tensor < 0 or any(len(local) % tensor for local in per_process):
        raise config_lib.ConfigError(
            f"--config.rollout.sampler_tensor={tensor}: a sampler group must split each "
            f"process's {len(per_process[0])} chips evenly"
        )
    grids = [np.array(local).reshape(-1, 1, tensor) for local in per_process]
    mine = processes.index(jax.process_index()) if len(processes) > 1 else 0
    return SamplingLayout(_mesh(grids[mine]), _mesh(np.concatenate(grids)), compute_dtype)


def _mesh(grid: np.ndarray) -> Mesh:
    return Mesh(grid, sharding.MESH_AXES, axis_types=(AxisType.Auto,) * 3)
