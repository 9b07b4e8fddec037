"""Orbax checkpoints of the whole training state, for exact resume.

A checkpoint holds three items:
  params     the policy parameters (sharded arrays, restored straight onto the mesh)
  opt_state  the optax state (sharded like the parameters)
  host       JSON: step, data position, tag statistics and utilities, interface state, the best
             evaluation score so far, and the parameter shapes (to refuse a mismatched config)

Saves are asynchronous by default: `save` blocks only while the arrays are copied off the
devices (and while the previous save, if still writing, finishes), and returns the seconds it
blocked; the files are written while the next step runs. Each save is atomic (orbax writes a
temporary directory and renames it, or on gs:// writes a commit marker last), so a process killed
mid-save leaves the previous checkpoints intact and the unfinished one is ignored, then cleaned
up, on restart. The last `keep` checkpoints are kept, plus the one with the best evaluation
metric; the ones that fall out are deleted only once the new one is complete. Paths go through
orbax's own handling (etils.epath), so the directory may be local or gs://.

`restore_latest` restores the newest checkpoint that reads back whole; one that does not (files
missing, a JSON part that does not parse, an array of another shape than its record) is
reported in one line and the one before it is tried.
"""

from __future__ import annotations

import os
import time
from typing import Any

import jax
import orbax.checkpoint as ocp
from absl import logging
from etils import epath
from orbax.checkpoint.checkpoint_managers import preservation_policy as pp

from seal_jax.sharding import path_str

KIND = "seal_jax.train_state"


class CheckpointMismatchError(ValueError):
    """A work directory whose checkpoints cannot be resumed with the current config."""


class UnreadableCheckpointError(ValueError):
    """A checkpoint that does not read back whole (truncated, corrupted or not ours)."""


def param_shapes(params: Any) -> dict[str, list[int]]:
    """{"layers/self_attn/q_proj/kernel": [L, E, H*D], ...} for a parameter pytree."""
    leaves = jax.tree_util.tree_leaves_with_path(params)
    return {path_str(p): list(x.shape) for p, x in leaves}


def _abstract(tree: Any) -> Any:
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), tree)


def _best_metric(metrics: dict | None) -> float:
    return float((metrics or {}).get("best_metric", float("-inf")))


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0][:200]}" if text else type(error).__name__


class Checkpointer:
    """Saves and restores (params, opt_state, host state) under `<workdir>/checkpoints`."""

    def __init__(
        self, workdir: str, keep: int = 3, asynchronous: bool = True, read_only: bool = False
    ):
        """Opens (or, unless `read_only`, creates) the checkpoint directory; `workdir` may be a
        local path or a gs:// URI. `asynchronous`: saves return once the arrays are copied off
        the devices (else once on disk). `read_only` (eval, export): never writes or deletes.
        Raises OSError if a local directory is not writable."""
        # orbax refuses relative paths; a gs:// path is absolute already.
        local = "://" not in workdir
        self.directory = epath.Path(os.path.abspath(workdir) if local else workdir) / "checkpoints"
        if not read_only:
            self.directory.mkdir(parents=True, exist_ok=True)
            probe = self.directory / f".writable.{jax.process_index()}"
            probe.write_text("")  # an unwritable directory fails here, not at the first save
            probe.unlink()
        policy = pp.AnyPreservationPolicy(
            [pp.LatestN(n=keep), pp.BestN(get_metric_fn=_best_metric, n=1)]
        )
        self.manager = ocp.CheckpointManager(
            self.directory,
            options=ocp.CheckpointManagerOptions(
                preservation_policy=policy,
                save_interval_steps=0 if read_only else 1,
                create=not read_only,
                read_only=read_only,
                cleanup_tmp_directories=not read_only,  # what a killed save left behind
                enable_async_checkpointing=asynchronous,
            ),
        )

    def latest_step(self) -> int | None:
        """The newest finalized checkpoint's step (whether it reads back or not), or None."""
        return self.manager.latest_step()

    def save(self, step: int, params: Any, opt_state: Any, host: dict, metric: float) -> float:
        """Writes checkpoint `step`; `metric` ranks it for best-keeping. Returns the seconds the
        call blocked (with asynchronous saves: the device-to-host copy, and the wait for the
        previous save if it was still writing)."""
        host = {**host, "kind": KIND, "param_shapes": param_shapes(params)}
        t0 = time.perf_counter()
        self.manager.save(
            step,
            args=ocp.args.Composite(
                params=ocp.args.StandardSave(params),
                opt_state=ocp.args.StandardSave(opt_state),
                host=ocp.args.JsonSave(host),
            ),
            metrics={"best_metric": metric},
        )
        return time.perf_counter() - t0

    def restore(self, step: int, params: Any, opt_state: Any | None) -> tuple[Any, Any, dict]:
        """Restores `step` onto the shardings of the given (template) params and opt_state
        (None: the parameters only, e.g. for eval or export; None comes back in its place).

        Raises:
          CheckpointMismatchError: the checkpoint's parameter shapes differ from the template's
            (a config that disagrees with the work directory).
          UnreadableCheckpointError: the checkpoint does not read back whole.
        """
        host = self._host(step, params)
        items = {"params": ocp.args.StandardRestore(_abstract(params))}
        if opt_state is not None:
            items["opt_state"] = ocp.args.StandardRestore(_abstract(opt_state))
        try:
            restored = self.manager.restore(step, args=ocp.args.Composite(**items))
        except Exception as e:  # noqa: BLE001  (orbax and tensorstore raise many kinds)
            raise UnreadableCheckpointError(f"checkpoint {step}: {_first_line(e)}") from None
        return restored["params"], restored.get("opt_state"), host

    def restore_latest(
        self, params: Any, opt_state: Any | None, discard_unreadable: bool = False
    ) -> tuple[int, Any, Any, dict] | None:
        """(step, params, opt_state, host) of the newest checkpoint that reads back whole
        (`restore`), or None when there is none. Each newer one that does not is reported in one
        line and, with `discard_unreadable` (training, which would write that step again),
        deleted. Raises UnreadableCheckpointError when none reads back, CheckpointMismatchError
        as `restore`."""
        unreadable = []
        for step in sorted(self.manager.all_steps(), reverse=True):
            try:
                restored = self.restore(step, params, opt_state)
            except UnreadableCheckpointError as e:
                unreadable.append((step, str(e)))
                continue
            for bad, why in unreadable:
                fate = "deleted (training writes that step again)" if discard_unreadable else "kept"
                logging.warning(
                    "checkpoint %d does not read back (%s): restored step %d of %s instead; %d %s",
                    bad,
                    why,
                    step,
                    self.directory,
                    bad,
                    fate,
                )
                if discard_unreadable:
                    self.manager.delete(bad)
            return step, *restored
        if unreadable:
            raise UnreadableCheckpointError(
                f"no checkpoint in {self.directory} reads back (newest: {unreadable[0][1]}); "
                "use another --workdir"
            )
        return None

    def _host(self, step: int, params: Any) -> dict:
        """The host item of `step`, checked against the template params (see `restore`)."""
        where = self.directory / str(step)
        try:
            args = ocp.args.Composite(host=ocp.args.JsonRestore())
            host = self.manager.restore(step, args=args)["host"]
        except Exception as e:  # noqa: BLE001  (orbax raises many kinds for foreign data)
            raise UnreadableCheckpointError(
                f"{where} is not a readable seal_jax training checkpoint ({_first_line(e)})"
            ) from None
        if not isinstance(host, dict) or host.get("kind") != KIND:
            raise UnreadableCheckpointError(f"{where} is not a seal_jax training checkpoint")
        expected, saved = param_shapes(params), host.get("param_shapes", {})
        for name in sorted(set(expected) | set(saved)):
            if expected.get(name) != saved.get(name):
                raise CheckpointMismatchError(
                    f"{where}: parameter {name} has shape {saved.get(name)} in the checkpoint but "
                    f"{expected.get(name)} under the current config (use another --workdir)"
                )
        return host

    def __enter__(self) -> Checkpointer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def wait(self) -> None:
        """Blocks until pending asynchronous saves are on disk."""
        self.manager.wait_until_finished()

    def close(self) -> None:
        """Waits for pending saves and releases the manager."""
        self.manager.wait_until_finished()
        self.manager.close()
