"""Decode memory of Qwen3.5-4B against Qwen2.5-3B and -7B at 4k, 8k and 16k tokens of history.

A decoding row keeps a state: the keys and values of every attention layer, which grow with the
history, and for Qwen3.5's linear-attention layers a float32 recurrent state and the
convolution's last inputs, which do not (`seal_jax.models.qwen35`: 8 of its 32 layers have a KV
cache). For each model and history this prints, per row:

* analytic: `seal_jax.estimate.cache_bytes_per_row` from the model's config.json alone (bf16
  keys and values), split into what grows (KV and the mask) and what does not (the linear
  layers' states and the write position);
* cache arrays: the rollout engine's cache (`RolloutEngine.abstract_cache`, as its decode
  program takes it) divided by its rows;

and the engine's decode program (`seal_jax.aot.lower_rollout`'s rollout_decode: the token loop
over `--rows` rows, bf16 weights, the cache donated) compiled for ONE chip: the abstract device
of `--topology` (libtpu, no TPU needed; temporaries: the HBM block of the compiler's buffer
assignment, `seal_jax.aot.compile_memory`), or this host's first CPU device when libtpu is not
importable (the CPU backend's `memory_analysis()`; the table says which). Its arguments are the
weights, the cache and the loop's per-row inputs; the cache's share of them, per row, must equal
the analytic figure ("compiled cache / row").

    JAX_PLATFORMS=cpu PYTHONPATH=/path/to/libtpu_pkg python -m benchmarks.decode_memory_qwen35
    python -m benchmarks.decode_memory_qwen35 --topology= --models=qwen3.5-4b   # CPU backend
"""

from __future__ import annotations

import math
import os
import sys
import time
from typing import Any

import jax
import jax.numpy as jnp
from absl import app, flags

from configs import qwen, qwen35
from seal_jax import aot, estimate, rollout, sharding
from seal_jax.models.config import architecture_from_dir

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# model -> the config module whose release settings decode it
MODELS = {"qwen3.5-4b": qwen35, "qwen2.5-3b": qwen, "qwen2.5-7b": qwen}
GIB, MIB = 2**30, 2**20


def _libtpu() -> bool:
    """Whether libtpu is importable (TPU topologies can be compiled for)."""
    try:
        import libtpu  # noqa: F401
    except ImportError:
        return False
    return True


flags.DEFINE_list("models", list(MODELS), "Of benchmarks/model_configs: " + ", ".join(MODELS))
flags.DEFINE_list("histories", ["4096", "8192", "16384"], "Tokens of history (cache slots).")
flags.DEFINE_integer("rows", 8, "Rows decoded together (one task's 8 rollouts).")
flags.DEFINE_string(
    "topology",
    "v5p:1x1x1" if _libtpu() else "",
    "One-chip TPU topology to compile for; empty: this host's first device (CPU backend).",
)
FLAGS = flags.FLAGS


def nbytes(tree: Any) -> int:
    """Bytes of a pytree of arrays or ShapeDtypeStructs, whole (one device holds all of it)."""
    return sum(math.prod(x.shape) * x.dtype.itemsize for x in jax.tree.leaves(tree))


def measure(name: str, history: int, devices: list[Any]) -> dict:
    """One model's decode at `history` slots on one device: per-row state and the compiled
    decode program's memory."""
    cfg = architecture_from_dir(os.path.join(ROOT, "benchmarks", "model_configs", name))
    config = MODELS[name].get_config()
    config.rollout.context_limit = history
    # Below the context (the decode loop's buffers hold decode_segment tokens either way).
    config.rollout.max_new_tokens = min(config.rollout.max_new_tokens, history // 2)
    config.rollout.micro_batch_tasks = FLAGS.rows // config.rl.group_size
    config.rollout.sampler_tensor = 0  # one chip: the engine reads the params as they are
    mesh = sharding.make_mesh(1, 1, 1, devices)
    dtype = jnp.bfloat16
    model = aot.abstract_model(cfg, mesh, dtype, dtype)  # the bf16 weights decode reads
    engine_config = rollout.EngineConfig.from_config(
        config.rollout, config.rollout.max_new_tokens, stop_ids=(0,)
    )
    engine = rollout.RolloutEngine(cfg, mesh, engine_config, dtype)
    start = time.perf_counter()
    lowered, args = aot.lower_rollout(config, model, engine)["rollout_decode"]
    tpu = devices[0].platform == "tpu"
    memory, _ = aot.compile_memory("rollout_decode", lowered, args, tpu=tpu)
    params, cache, inputs = args[0], args[1], args[2:]
    rows, slots = cache["mask"].shape
    analytic = estimate.cache_bytes_per_row(cfg, slots, jnp.dtype(engine.cache_dtype).itemsize)
    weights = nbytes(params)
    return {
        "model": name,
        "slots": slots,
        "rows": rows,
        "grows": analytic["kv"] + analytic["mask"],
        "constant": analytic["conv"] + analytic["state"] + analytic["index"],
        "analytic": sum(analytic.values()),
        "arrays": nbytes(cache) / rows,
        "weights": weights,
        "arguments": memory.argument_bytes,
        "temp": memory.temp_bytes,
        "total": memory.peak_bytes,
        "compiled_cache": (memory.argument_bytes - weights - nbytes(inputs)) / rows,
        "error": memory.error,
        "seconds": time.perf_counter() - start,
    }


def table(results: list[dict], backend: str) -> str:
    """The figures as a markdown table: per row in MiB, the compiled program in GiB."""
    head = (
        "| model | history (slots) | per row, analytic: grows (KV + mask) / constant (linear "
        "states) / total, MiB | per row, cache arrays, MiB | compiled cache / row, MiB | "
        f"compiled decode on {backend}, {results[0]['rows']} rows: weights / cache + inputs / "
        "temporaries / total, GiB |"
    )
    lines = [head, "|" + " --- |" * 6]
    for r in results:
        rest = r["arguments"] - r["weights"]
        compiled = " / ".join(
            f"{b / GIB:.2f}" for b in (r["weights"], rest, r["temp"], r["total"])
        ) + (" (does not fit)" if r["error"] else "")
        cells = [
            r["model"],
            str(r["slots"]),
            f"{r['grows'] / MIB:.1f} / {r['constant'] / MIB:.1f} / {r['analytic'] / MIB:.1f}",
            f"{r['arrays'] / MIB:.1f}",
            f"{r['compiled_cache'] / MIB:.1f}",
            compiled,
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str]) -> None:
    """Compiles each model's decode at each history and prints the table."""
    del argv
    devices = aot.target_devices(FLAGS.topology)[:1]
    device = devices[0]
    backend = (
        f"one {device.device_kind} chip ({FLAGS.topology}, libtpu)"
        if device.platform == "tpu"
        else f"the CPU backend ({device.device_kind}; no libtpu)"
    )
    results = []
    for name in FLAGS.models:
        for history in FLAGS.histories:
            r = measure(name, int(history), devices)
            print(
                f"{name} {r['slots']} slots: {r['total'] / GIB:.2f} GiB compiled "
                f"({r['seconds']:.0f} s)",
                file=sys.stderr,
                flush=True,
            )
            results.append(r)
    print(table(results, backend))


if __name__ == "__main__":
    app.run(main)
