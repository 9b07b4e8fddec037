"""Greedy generation throughput: this engine versus transformers + torch `generate`, on CPU.

Both run the same random-weight model (built with transformers, loaded into JAX from the saved
checkpoint), float32, same prompts, exactly --new_tokens new tokens per row (no stop ids), one
untimed warm-up run each. "jax compile s" is the time JAX spent tracing, lowering and compiling
during the engine's warm-up run, as JAX itself reports it (`jax.monitoring` events), not the
difference of two wall times, which contention or a warm compilation cache can make negative.

    python -m benchmarks.bench_generate                      # small + qwen2.5-0.5b, batch 1 and 16
    python -m benchmarks.bench_generate --models=small --batches=1,16,64 --new_tokens=128
"""

from __future__ import annotations

import argparse
import resource
import tempfile
import time
from collections.abc import Callable
from typing import Any

import numpy as np

# jax.monitoring duration events whose sum is the time spent making programs (not nested: a jit
# traced inside another is not reported on its own).
COMPILE_EVENTS = (
    "/jax/core/compile/jaxpr_trace_duration",
    "/jax/core/compile/jaxpr_to_mlir_module_duration",
    "/jax/core/compile/backend_compile_duration",  # or loading it from a compilation cache
)

SHAPES = {
    # A small Qwen2: quick to run, shows per-step overheads.
    "small": dict(hidden_size=256, intermediate_size=768, num_hidden_layers=4,
                  num_attention_heads=4, num_key_value_heads=2, vocab_size=32000,
                  tie_word_embeddings=True),
    # The shape of Qwen2.5-0.5B(-Instruct) (about 494M parameters).
    "qwen2.5-0.5b": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                         num_attention_heads=14, num_key_value_heads=2, vocab_size=151936,
                         tie_word_embeddings=True),
}  # fmt: skip


def peak_rss_gib() -> float:
    """Peak resident memory of this process so far, GiB."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def build(shape: str, path: str):
    """Saves a random-weight transformers Qwen2 of `shape` at path; returns it."""
    import torch
    import transformers

    torch.manual_seed(0)
    config = transformers.Qwen2Config(
        max_position_embeddings=32768,
        rope_parameters={"rope_type": "default", "rope_theta": 1e6},
        **SHAPES[shape],
    )
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    model.save_pretrained(path)
    return model


def time_torch(model, prompts: np.ndarray, new_tokens: int) -> float:
    """Seconds for transformers greedy `generate` (after one warm-up run)."""
    import torch

    ids = torch.tensor(prompts, dtype=torch.long)
    kwargs = dict(
        max_new_tokens=new_tokens,
        min_new_tokens=new_tokens,
        do_sample=False,
        eos_token_id=None,
        pad_token_id=0,
        attention_mask=torch.ones_like(ids),
    )
    with torch.no_grad():
        model.generate(ids, **kwargs)  # warm-up
        start = time.perf_counter()
        out = model.generate(ids, **kwargs)
        elapsed = time.perf_counter() - start
    assert out.shape[1] == prompts.shape[1] + new_tokens
    return elapsed


def compile_seconds(step: Callable[[], Any]) -> float:
    """Runs step(); returns the seconds JAX spent tracing, lowering and compiling during it."""
    import jax

    total = 0.0

    def listen(event: str, duration_secs: float, **_: Any) -> None:
        nonlocal total
        if event in COMPILE_EVENTS:
            total += duration_secs

    jax.monitoring.register_event_duration_secs_listener(listen)
    try:
        step()
    finally:
        jax.monitoring.unregister_event_duration_listener(listen)
    return total


def time_jax(path: str, prompts: np.ndarray, new_tokens: int) -> tuple[float, float]:
    """(seconds for the engine's greedy generation after a warm-up run, seconds JAX spent
    compiling during the warm-up run)."""
    from seal_jax.models import load_hf_checkpoint
    from seal_jax.rollout import EngineConfig, RolloutEngine
    from seal_jax.sampler import SamplingParams

    model = load_hf_checkpoint(path)
    config = EngineConfig(
        context_limit=prompts.shape[1] + new_tokens + 1,
        max_new_tokens=new_tokens,
        stop_ids=(),
        sampling=SamplingParams("greedy"),
        min_cache_len=64,
    )
    engine = RolloutEngine(model.config, model.mesh, config)

    def generate() -> dict:
        return engine.start(model.params, prompts.tolist()).generate()

    compile_s = compile_seconds(generate)  # the warm-up run compiles every program
    start = time.perf_counter()
    turns = generate()
    elapsed = time.perf_counter() - start
    assert all(len(t.ids) == new_tokens for t in turns.values())
    return elapsed, compile_s


def main() -> None:
    """Prints the throughput table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="small,qwen2.5-0.5b")
    parser.add_argument("--batches", default="1,16")
    parser.add_argument("--prompt_len", type=int, default=32)
    parser.add_argument("--new_tokens", type=int, default=32)
    args = parser.parse_args()
    import torch

    print(
        f"torch threads {torch.get_num_threads()}; prompt {args.prompt_len}, "
        f"new tokens {args.new_tokens}; tokens/s = batch * new tokens / wall time"
    )
    print(
        f"{'model':>14} {'batch':>5} {'torch tok/s':>12} {'jax tok/s':>10} {'jax/torch':>9} "
        f"{'jax compile s':>13} {'peak RSS GiB':>12}"
    )
    rng = np.random.default_rng(0)
    for shape in args.models.split(","):
        with tempfile.TemporaryDirectory() as path:
            model = build(shape, path)
            for batch in map(int, args.batches.split(",")):
                prompts = rng.integers(0, SHAPES[shape]["vocab_size"], (batch, args.prompt_len))
                t_torch = time_torch(model, prompts, args.new_tokens)
                t_jax, compile_s = time_jax(path, prompts, args.new_tokens)
                n = batch * args.new_tokens
                print(
                    f"{shape:>14} {batch:>5} {n / t_torch:>12.1f} {n / t_jax:>10.1f} "
                    f"{t_torch / t_jax:>9.2f} {compile_s:>13.1f} {peak_rss_gib():>12.2f}",
                    flush=True,
                )


if __name__ == "__main__":
    main()
