"""Qwen2.5-7B decode on TPU targets against the HBM roofline, from the compiler's figures.

A decode step is bound by HBM bandwidth: each chip of a sampling group (`seal_jax.weight_sync`)
reads its shard of the bf16 sampling copy and of its group's KV cache once per generated token.
This script compiles, for each target's topology (abstract devices from libtpu; no TPU, no
weights), ONE decode step as the rollout engine's decode loop body runs it
(`seal_jax.rollout.decode_segment`'s body: a cached forward of one token per row and the sampling
of the next, the engine's shardings, the sampling layout's params, the cache donated) with the
layer scan fully unrolled, so that `compiled.cost_analysis()["bytes accessed"]` (per chip: the
program is SPMD) is the bytes moved per generated token; the decode loop itself counts its loop
bodies once, so its own figure is not per token. It also compiles the engine's real decode
program (`seal_jax.aot.lower_rollout`) to count the weight all-gathers inside its token loop
(`seal_jax.aot.weight_gathers_per_token`; 0 with the sampling layout).

Ideal bytes per token per chip: the local shard of every weight but the input embedding (a
lookup reads one row per token) plus the group's rows' KV cache over the compiled cache length,
divided over the group's chips. Tokens/s per chip = rows per group / (bytes / HBM bandwidth) /
chips per group, for the compiled bytes (the estimate) and for the ideal bytes (the roofline).

    JAX_PLATFORMS=cpu PYTHONPATH=/path/to/libtpu_pkg \
      python -m benchmarks.decode_roofline --targets=v5p-8,v4-8,v5e-8 --cache_lens=16384,8192
"""

from __future__ import annotations

import dataclasses
import functools
import os
import sys
import time
from typing import Any

import jax
import jax.numpy as jnp
from absl import app, flags
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from configs import qwen
from seal_jax import aot, episodes, estimate, rollout, sharding, weight_sync
from seal_jax.models import QwenConfig, model_class
from seal_jax.models.checkpoint import param_shapes
from seal_jax.models.config import architecture_from_dir
from seal_jax.sampler import SamplingParams, sample

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODEL_DIR = os.path.join(ROOT, "benchmarks", "model_configs", "qwen2.5-7b")
# target -> (configs/qwen.py target whose rollout settings it uses, topology). v5e-8 has no 7B
# training target (the fp32 training state does not fit 8 x 16 GiB): it decodes with
# 7b-v5e-16's rollout settings (one task's 8 rows per host, groups of 4 chips) on v5e:2x4, which
# libtpu describes as 2 hosts of 4 chips: each host's one group decodes its own chunk of 8 rows.
TARGETS = {
    "v5p-8": ("7b-v5p-8", "v5p:2x2x1"),
    "v4-8": ("7b-v4-8", "v4:2x2x1"),
    "v5e-8": ("7b-v5e-16", "v5e:2x4"),
}
GIB = 2**30

flags.DEFINE_list("targets", list(TARGETS), "Targets to compile, of " + ", ".join(TARGETS))
flags.DEFINE_list("cache_lens", ["16384"], "Cache lengths (slots, all attended) to compile.")
flags.DEFINE_bool("loop_gathers", True, "Also compile the decode loop to count its gathers.")
flags.DEFINE_string("hlo_dir", "", "Write each compiled step's optimized HLO here.")
FLAGS = flags.FLAGS


@dataclasses.dataclass(frozen=True)
class Setup:
    """One target's decode: its architecture, engine, sampling copy and rows."""

    name: str
    cfg: QwenConfig
    config: Any
    engine: rollout.RolloutEngine
    params: Any  # the sampling copy as ShapeDtypeStructs on the engine's mesh
    rows: int  # rows of the compiled batch (all groups)
    group: int  # chips per sampling group

    @property
    def groups(self) -> int:
        return self.engine.mesh.shape["data"]

    @property
    def rows_per_group(self) -> int:
        return self.rows // self.groups


def setup(name: str) -> Setup:
    """The rollout engine of a target as `run.py --mode=compile` builds it (one host)."""
    spec, topology = TARGETS[name]
    config = qwen.get_config(spec)
    config.aot.topology = topology
    cfg = architecture_from_dir(MODEL_DIR)
    devices = aot.target_devices(topology)
    dtype = jnp.bfloat16
    layout = weight_sync.sampling_layout(config.rollout.sampler_tensor, dtype, devices)
    engine_config = rollout.EngineConfig.from_config(
        config.rollout, config.rollout.max_new_tokens, stop_ids=(0,)
    )
    engine = rollout.RolloutEngine(cfg, layout.mesh, engine_config, dtype, layout)
    shapes = param_shapes(cfg, dtype)
    params = jax.tree.map(
        lambda x, sh: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sh),
        shapes,
        layout.shardings(shapes, layout.mesh),
    )
    rows = engine.batch_bucket(episodes.chunk_rows(config))
    return Setup(name, cfg, config, engine, params, rows, config.rollout.sampler_tensor)


def decode_step(
    params: Any,
    cache: dict,
    tok: jax.Array,
    keys: jax.Array,
    *,
    cfg: QwenConfig,
    sampling: SamplingParams,
) -> tuple[dict, jax.Array, jax.Array, jax.Array]:
    """One trip of the decode loop for every row: feeds tok [B] at each row's write position and
    samples the next token; layers unrolled (`scan_unroll`). Returns (cache, ids, sampling and
    policy log-probs)."""
    model = model_class(cfg)(cfg, dtype=jnp.bfloat16, scan_unroll=cfg.num_layers)
    index = cache["index"]
    feed = jnp.ones_like(tok, dtype=bool)
    logits, cache = model.apply(
        {"params": params}, tok[:, None], index[:, None], feed[:, None], cache, method="logits"
    )
    ids, sampling_lp, policy_lp = sample(logits[:, 0], keys, cache["index"], sampling)
    return cache, ids, sampling_lp, policy_lp


def lower_step(s: Setup, cache_len: int) -> tuple[Any, tuple]:
    """`decode_step` lowered with the engine's decode shardings; returns (lowered, arguments)."""
    engine = s.engine
    cache = engine.abstract_cache(s.rows, cache_len)
    tok = engine.abstract_rows((s.rows,), jnp.int32)
    keys = jax.eval_shape(lambda: jax.random.split(jax.random.key(0), s.rows))
    keys = engine.abstract_rows(keys.shape, keys.dtype)
    rows_1d = NamedSharding(engine.mesh, P(sharding.BATCH_AXES))
    cache_shardings = {k: v.sharding for k, v in cache.items()}
    fn = jax.jit(
        functools.partial(decode_step, cfg=s.cfg, sampling=engine.config.sampling),
        in_shardings=(
            jax.tree.map(lambda x: x.sharding, s.params),
            cache_shardings,
            rows_1d,
            rows_1d,
        ),
        out_shardings=(cache_shardings, rows_1d, rows_1d, rows_1d),
        donate_argnums=(1,),
    )
    args = (s.params, cache, tok, keys)
    with jax.set_mesh(engine.mesh):
        return fn.lower(*args), args


def bytes_accessed(compiled: Any) -> float:
    """The compiler's "bytes accessed" of a compiled program (per device)."""
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    return float(cost["bytes accessed"])


def ideal_bytes(s: Setup, cache_len: int) -> dict[str, float]:
    """Bytes a chip must read per step: its shard of every weight but the input embedding, and
    its share of the group's rows' KV cache over cache_len slots."""
    leaves = jax.tree_util.tree_flatten_with_path(s.params)[0]
    weights = sum(
        aot.device_bytes(x) for path, x in leaves if "embed_tokens" not in sharding.path_str(path)
    )
    cfg = s.cfg
    kv_per_token = 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * 2  # k and v, bf16
    cache = s.rows_per_group * cache_len * kv_per_token / s.group
    return {"weights": weights, "cache": cache, "total": weights + cache}


def loop_gathers(s: Setup) -> dict:
    """The weight all-gathers per token in the engine's real decode program (its token loop)."""
    lowered, args = aot.lower_rollout(s.config, _as_loaded(s), s.engine)["rollout_decode"]
    compiled = lowered.compile()
    return aot.weight_gathers_per_token(compiled.as_text(), args[0])


def _as_loaded(s: Setup) -> Any:
    """The trainer's fp32 params (FSDP over every chip of the layout) as `lower_rollout` takes
    them; only their shapes matter for the decode program."""
    m = s.config.mesh
    devices = list(s.engine.layout.global_mesh.devices.flat)
    mesh = sharding.make_mesh(m.data, m.fsdp, m.tensor, devices)
    return aot.abstract_model(s.cfg, mesh, jnp.float32, jnp.bfloat16)


def measure(s: Setup, cache_len: int, gathers: dict) -> dict:
    """Compiles one decode step at cache_len; returns its table row's figures."""
    start = time.perf_counter()
    lowered, args = lower_step(s, cache_len)
    compiled = lowered.compile()
    memory = compiled.memory_analysis()
    if FLAGS.hlo_dir:
        os.makedirs(FLAGS.hlo_dir, exist_ok=True)
        with open(os.path.join(FLAGS.hlo_dir, f"{s.name}-{cache_len}.txt"), "w") as f:
            f.write(compiled.as_text())
    chip = estimate.CHIPS[s.engine.mesh.devices.flat[0].device_kind]
    compiled_bytes = bytes_accessed(compiled)
    ideal = ideal_bytes(s, cache_len)
    rate = lambda b: s.rows_per_group / (b / chip.hbm_bandwidth) / s.group  # noqa: E731
    return {
        "target": s.name,
        "group": s.group,
        "rows_per_group": s.rows_per_group,
        "cache_len": cache_len,
        "compiled_bytes": compiled_bytes,
        "argument_bytes": memory.argument_size_in_bytes,
        "local_shards": aot.device_bytes(args[:2]),
        "ideal": ideal,
        "gathers": gathers.get("count", "-"),
        "tokens_s": rate(compiled_bytes),
        "roofline_tokens_s": rate(ideal["total"]),
        "fraction": ideal["total"] / compiled_bytes,
        "seconds": time.perf_counter() - start,
    }


def table(rows: list[dict]) -> str:
    """The figures as a markdown table (GiB per chip per generated token)."""
    head = (
        "| target | chips/group | rows/group | cache len | compiled GiB/token/chip | ideal "
        "(weights + cache) | weight all-gathers in loop | est. tokens/s/chip | roofline "
        "tokens/s/chip | fraction |"
    )
    lines = [head, "|" + " --- |" * 10]
    for r in rows:
        i = r["ideal"]
        cells = [
            r["target"],
            r["group"],
            r["rows_per_group"],
            r["cache_len"],
            f"{r['compiled_bytes'] / GIB:.2f}",
            f"{i['total'] / GIB:.2f} ({i['weights'] / GIB:.2f} + {i['cache'] / GIB:.2f})",
            r["gathers"],
            f"{r['tokens_s']:.0f}",
            f"{r['roofline_tokens_s']:.0f}",
            f"{r['fraction']:.0%}",
        ]
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    return "\n".join(lines)


def main(argv: list[str]) -> None:
    """Compiles each target's decode step and prints the table."""
    del argv
    results = []
    for name in FLAGS.targets:
        s = setup(name)
        gathers = loop_gathers(s) if FLAGS.loop_gathers else {}
        for length in FLAGS.cache_lens:
            r = measure(s, s.engine.cache_len(int(length)), gathers)
            print(
                f"{name} cache {r['cache_len']}: {r['compiled_bytes'] / GIB:.3f} GiB accessed, "
                f"arguments {r['argument_bytes'] / GIB:.3f} GiB (params + cache shards "
                f"{r['local_shards'] / GIB:.3f}), compiled in {r['seconds']:.0f} s",
                file=sys.stderr,
                flush=True,
            )
            results.append(r)
    print(table(results))


if __name__ == "__main__":
    app.run(main)
