"""Batched sampling at RL sizes: milliseconds per decode step of the rollout engine.

The CPU default's RL step samples 8 tasks x 8 (64 rows) or, with 32 tasks per step, 256 rows,
from ~400-token prompts, and its caches hold 512-1024 slots. This times one turn of exactly
--new_tokens sampled tokens per row (no stop id in reach; one untimed warm-up run that also
compiles), for each (rows, cache slots) pair, on the suite's tiny policy (random weights: speed
does not depend on them). The time includes the shared prompt prefill and the copy of each
prompt's cache row to its 8 samples, so it is what a rollout's first turn costs.

    python -m benchmarks.bench_rollout_batch
    python -m benchmarks.bench_rollout_batch --rows=256 --caches=1024
"""

from __future__ import annotations

import argparse
import tempfile
import time

import jax.numpy as jnp
import numpy as np

SAMPLES = 8  # rows per prompt, as GRPO groups


def time_turn(engine, params, prompts: list[list[int]], seed: int) -> float:
    """Seconds for one first turn of len(prompts) * SAMPLES rows sampled from params."""
    start = time.perf_counter()
    engine.start(params, prompts, num_samples=SAMPLES, seed=seed).generate()
    return time.perf_counter() - start


def main() -> None:
    """Prints one table row per (rows, cache slots)."""
    from configs.tiny import get_config
    from seal_jax import sharding
    from seal_jax.models import load_hf_checkpoint
    from seal_jax.rollout import EngineConfig, RolloutEngine
    from seal_jax.sampler import SamplingParams
    from seal_jax.sft import make_tiny_policy

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="64,256", help="rows per turn (multiples of 8)")
    parser.add_argument("--caches", default="512,1024", help="cache slots (>= prompt + new)")
    parser.add_argument("--prompt_len", type=int, default=400)
    parser.add_argument("--new_tokens", type=int, default=64)
    args = parser.parse_args()

    path = tempfile.mkdtemp()
    make_tiny_policy(path)
    mesh = sharding.mesh_from_config(get_config().mesh)
    model = load_hf_checkpoint(path, mesh=mesh, dtype=jnp.float32, compute_dtype=jnp.float32)
    rng, vocab = np.random.default_rng(0), model.config.vocab_size
    print("| rows | cache slots | turn s | ms per decode step |")
    print("| ---: | ---: | ---: | ---: |")
    for cache in map(int, args.caches.split(",")):
        config = EngineConfig(
            context_limit=cache,
            max_new_tokens=args.new_tokens,
            stop_ids=(vocab,),  # never sampled: every row runs its budget
            sampling=SamplingParams("sample", temperature=1.0),
            min_cache_len=cache,
        )
        engine = RolloutEngine(model.config, mesh, config)
        for rows in map(int, args.rows.split(",")):
            prompts = [
                rng.integers(0, vocab, args.prompt_len).tolist() for _ in range(rows // SAMPLES)
            ]
            time_turn(engine, model.params, prompts, seed=0)
            seconds = time_turn(engine, model.params, prompts, seed=1)
            per_step = 1000 * seconds / args.new_tokens
            print(f"| {rows} | {cache} | {seconds:.2f} | {per_step:.1f} |", flush=True)


if __name__ == "__main__":
    main()
