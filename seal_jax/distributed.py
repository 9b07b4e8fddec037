"""Multi-host plumbing: jax.distributed start-up and host data shared across processes.

The trainer runs one controller per host. Rollouts are host-local: each process generates the
episodes of its share of the step's tasks on its own devices (from the sampling copy of the
parameters, `seal_jax.weight_sync`) with its own environment pool;
the episodes are then gathered so that every process holds the whole step's host data (and so
takes identical host-side decisions: tag statistics, utilities, interface), and the update runs
on the global mesh with globally sharded parameters and batches.
"""

from __future__ import annotations

import pickle
from typing import Any

import jax
import numpy as np
from absl import logging
from jax.experimental import multihost_utils
from jax.sharding import NamedSharding


def initialize(dist_config: Any) -> None:
    """Starts jax.distributed (on TPU pods every argument is discovered when left empty)."""
    kwargs = {}
    if dist_config.coordinator_address:
        kwargs = {
            "coordinator_address": dist_config.coordinator_address,
            "num_processes": dist_config.num_processes,
            "process_id": dist_config.process_id,
        }
    jax.distributed.initialize(**kwargs)
    logging.info("process %d of %d", jax.process_index(), jax.process_count())


def multi_process() -> bool:
    """Whether more than one controller process takes part."""
    return jax.process_count() > 1


def allgather_objects(obj: Any) -> list[Any]:
    """[obj of process 0, obj of process 1, ...] on every process (pickled host data)."""
    if not multi_process():
        return [obj]
    data = np.frombuffer(pickle.dumps(obj), np.uint8)
    sizes = np.asarray(multihost_utils.process_allgather(np.array([data.size], np.int64)))
    padded = np.zeros(int(sizes.max()), np.uint8)
    padded[: data.size] = data
    gathered = np.asarray(multihost_utils.process_allgather(padded[None], tiled=True))
    return [pickle.loads(gathered[p, : int(n)].tobytes()) for p, n in enumerate(sizes.ravel())]


def to_host(x: jax.Array) -> np.ndarray:
    """The full value of a (possibly multi-process) array on this host."""
    if x.is_fully_replicated:
        return np.asarray(x.addressable_data(0))
    if not x.is_fully_addressable:
        return np.asarray(multihost_utils.process_allgather(x, tiled=True))
    return np.asarray(jax.device_get(x))


def put_global(x: np.ndarray, target: NamedSharding) -> jax.Array:
    """A global array from a host array that every process holds in full."""
    return jax.make_array_from_callback(x.shape, target, lambda index: x[index])
