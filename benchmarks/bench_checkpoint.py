"""Checkpoint cost on the training loop: how long each save blocks, synchronous against
asynchronous (`train.async_checkpoints`), and its share of the step time.

The saved state is the trainer's (`seal_jax.checkpointing.Checkpointer`): float32 parameters of
the chosen shape (random), the optimizer state of configs/base.py's optimizer (Adam moments in
float32) and a small host record. Each step is a stand-in for a training step: one jitted
optimizer update of the whole state (it touches every array, as a real step does), padded with
`--step_s` seconds of host idle time (what the host does while a TPU computes: a real SEAL step
at this shape takes minutes). Then the step's checkpoint is saved (checkpoint_every=1, keep=1)
and the call's blocking time measured. Asynchronous saves block for the copy off the devices
and, when the previous write is still going, for its end; the step time counts the update, the
padding and the save's blocking time.

    python -m benchmarks.bench_checkpoint
    python -m benchmarks.bench_checkpoint --step_s=30
    # options: --shape=tiny|small|qwen2.5-0.5b --steps=3 --modes=sync,async --dir=DIR
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.bench_multiturn import SHAPES, model_config


def _state(shape: str) -> tuple[Any, Any, Any]:
    """(params, opt_state, jitted stand-in step) of the shape, float32, on the first device."""
    from configs.base import base_config
    from seal_jax import optim
    from seal_jax.models import init_params

    cfg = model_config(shape)
    params = jax.jit(lambda key: init_params(cfg, key))(jax.random.key(0))
    optimizer = optim.make_optimizer(base_config().optim)
    opt_state = jax.jit(optimizer.init)(params)

    def step(params: Any, opt_state: Any) -> tuple[Any, Any]:
        grads = jax.tree.map(lambda p: 1e-3 * p, params)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return jax.tree.map(jnp.add, params, updates), opt_state

    return params, opt_state, jax.jit(step, donate_argnums=(0, 1))


def run_mode(mode: str, state: tuple, steps: int, step_s: float, base: str) -> dict:
    """Times `steps` steps, each followed by a save, with sync or async checkpoints."""
    from seal_jax.checkpointing import Checkpointer

    params, opt_state, step_fn = state
    workdir = tempfile.mkdtemp(prefix=f"bench_ckpt_{mode}_", dir=base)
    checkpointer = Checkpointer(workdir, keep=1, asynchronous=mode == "async")
    blocking, totals = [], []
    for s in range(1, steps + 1):
        t0 = time.perf_counter()
        params, opt_state = jax.block_until_ready(step_fn(params, opt_state))
        time.sleep(step_s)
        blocking.append(checkpointer.save(s, params, opt_state, {"step": s}, float("-inf")))
        totals.append(time.perf_counter() - t0)
    t0 = time.perf_counter()
    checkpointer.close()  # the last asynchronous write, which the next step would overlap
    tail = time.perf_counter() - t0
    shutil.rmtree(workdir)
    return {"blocking": blocking, "step": totals, "tail": tail, "state": (params, opt_state)}


def main() -> None:
    """Prints one row per mode: blocking seconds per save, step seconds, blocking share."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="qwen2.5-0.5b", choices=list(SHAPES))
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--step_s", type=float, default=0.0, help="host idle time per step")
    parser.add_argument("--modes", default="sync,async")
    parser.add_argument("--dir", default=None, help="where checkpoints go (default: a tempdir)")
    args = parser.parse_args()
    params, opt_state, step_fn = _state(args.shape)
    leaves = jax.tree.leaves((params, opt_state))
    gib = sum(x.size * x.dtype.itemsize for x in leaves) / 2**30
    print(f"{args.shape}: {gib:.2f} GiB of state per checkpoint, {args.steps} steps per mode, "
          f"{args.step_s:g} s of host idle time per step, {jax.devices()[0].platform}")  # fmt: skip
    print("| saves | blocking s per save (each) | step s (mean) | blocking share | last write s |")
    print("| --- | --- | ---: | ---: | ---: |")
    state = (params, opt_state, step_fn)
    for mode in args.modes.split(","):
        out = run_mode(mode, state, args.steps, args.step_s, args.dir)
        state = (*out["state"], step_fn)
        each = ", ".join(f"{s:.2f}" for s in out["blocking"])
        share = sum(out["blocking"]) / sum(out["step"])
        print(f"| {mode} | {each} | {np.mean(out['step']):.2f} | {100 * share:.0f}% | "
              f"{out['tail']:.2f} |")  # fmt: skip


if __name__ == "__main__":
    main()
