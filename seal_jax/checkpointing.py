"""Orbax checkpoints of the whole training state, for exact resume.

A checkpoint holds three items:
  params     the policy parameters (sharded arrays, restored straight onto the mesh)
  opt_state  the optax state (sharded like the parameters)
  host       JSON: step, data position, tag statistics and utilities, interface state, the best
             evaluation score so far, and the parameter shapes (to refuse a mismatched config)
The last `keep` checkpoints are kept, plus the one with the best evaluation metric. Saves are
atomic (orbax writes to a temporary directory and renames), so a process killed mid-save leaves
the previous checkpoints intact and the half-written one is ignored on restart.
"""

from __future__ import annotations

import os
from typing import Any

import jax
import orbax.checkpoint as ocp
from orbax.checkpoint.checkpoint_managers import preservation_policy as pp

from seal_jax.sharding import path_str

KIND = "seal_jax.train_state"


class CheckpointMismatchError(ValueError):
    """A work directory whose checkpoints cannot be resumed with the current config."""


def param_shapes(params: Any) -> dict[str, list[int]]:
    """{"layers/self_attn/q_proj/kernel": [L, E, H*D], ...} for a parameter pytree."""
    leaves = jax.tree_util.tree_leaves_with_path(params)
    return {path_str(p): list(x.shape) for p, x in leaves}


def _abstract(tree: Any) -> Any:
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), tree)


def _best_metric(metrics: dict | None) -> float:
    return float((metrics or {}).get("best_metric", float("-inf")))


class Checkpointer:
    """Saves and restores (params, opt_state, host state) under `<workdir>/checkpoints`."""

    def __init__(self, workdir: str, keep: int = 3):
        """Opens or creates the checkpoint directory; raises OSError if it is not writable."""
        self.directory = os.path.abspath(os.path.join(workdir, "checkpoints"))
        os.makedirs(self.directory, exist_ok=True)
        if not os.access(self.directory, os.W_OK):
            raise OSError(f"work directory {workdir!r} is not writable")
        policy = pp.AnyPreservationPolicy(
            [pp.LatestN(n=keep), pp.BestN(get_metric_fn=_best_metric, n=1)]
        )
        self.manager = ocp.CheckpointManager(
            self.directory,
            options=ocp.CheckpointManagerOptions(preservation_policy=policy, create=True),
        )

    def latest_step(self) -> int | None:
        """The newest complete checkpoint's step, or None."""
        return self.manager.latest_step()

    def save(self, step: int, params: Any, opt_state: Any, host: dict, metric: float) -> None:
        """Writes checkpoint `step` (asynchronously); `metric` ranks it for best-keeping."""
        host = {**host, "kind": KIND, "param_shapes": param_shapes(params)}
        self.manager.save(
            step,
            args=ocp.args.Composite(
                params=ocp.args.StandardSave(params),
                opt_state=ocp.args.StandardSave(opt_state),
                host=ocp.args.JsonSave(host),
            ),
            metrics={"best_metric": metric},
        )

    def restore(self, step: int, params: Any, opt_state: Any) -> tuple[Any, Any, dict]:
        """Restores `step` onto the shardings of the given (template) params and opt_state.

        Raises CheckpointMismatchError when the checkpoint is not ours or its parameter shapes
        differ from the template's (a config that disagrees with the checkpoint).
        """
        host = self._host(step, params)
        restored = self.manager.restore(
            step,
            args=ocp.args.Composite(
                params=ocp.args.StandardRestore(_abstract(params)),
                opt_state=ocp.args.StandardRestore(_abstract(opt_state)),
            ),
        )
        return restored["params"], restored["opt_state"], host

    def restore_params(self, step: int, params: Any) -> tuple[Any, dict]:
        """Restores only the parameters (and host data) of `step`, e.g. for eval or export."""
        host = self._host(step, params)
        restored = self.manager.restore(
            step, args=ocp.args.Composite(params=ocp.args.StandardRestore(_abstract(params)))
        )
        return restored["params"], host

    def _host(self, step: int, params: Any) -> dict:
        """The host item of `step`, checked against the template params (see `restore`)."""
        where = os.path.join(self.directory, str(step))
        try:
            host = self.manager.restore(step, args=ocp.args.Composite(host=ocp.args.JsonRestore()))[
                "host"
            ]
        except Exception as e:  # noqa: BLE001  (orbax raises many kinds for foreign data)
            raise CheckpointMismatchError(
                f"{where} is not a readable seal_jax training checkpoint ({type(e).__name__}); "
                "use another --workdir"
            ) from None
        if not isinstance(host, dict) or host.get("kind") != KIND:
            raise CheckpointMismatchError(f"{where} is not a seal_jax training checkpoint")
        self._check(host, params, step)
        return host

    def _check(self, host: dict, params: Any, step: int) -> None:
        where = os.path.join(self.directory, str(step))
        expected = param_shapes(params)
        saved = host.get("param_shapes", {})
        for name in sorted(set(expected) | set(saved)):
            if expected.get(name) != saved.get(name):
                raise CheckpointMismatchError(
                    f"{where}: parameter {name} has shape {saved.get(name)} in the checkpoint but "
                    f"{expected.get(name)} under the current config (use another --workdir)"
                )

    def wait(self) -> None:
        """Blocks until pending asynchronous saves are on disk."""
        self.manager.wait_until_finished()

    def close(self) -> None:
        """Waits for pending saves and releases the manager."""
        self.manager.wait_until_finished()
        self.manager.close()
