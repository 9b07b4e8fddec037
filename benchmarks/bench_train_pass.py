"""Training-pass speed of the suite's tiny policy: blocked causal attention and unrolled layers.

One warm-start step's shape (8 transcripts of 512 or 640 tokens, the tiny policy of
configs/tiny.py: hidden 128, 2 layers, float32): the time of value_and_grad of the token
log-probs, for causal attention in one [T, T] block (CAUSAL_BLOCK set to the length: the code
before blocks) or in CAUSAL_BLOCK-query blocks, each with the layer scan kept (scan_unroll 1) or
unrolled (2). All four are timed side by side in one run (one untimed call compiles each).

    python -m benchmarks.bench_train_pass
    python -m benchmarks.bench_train_pass --lengths=512 --repeats=20
"""

from __future__ import annotations

import argparse
import functools
import tempfile
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np


def seconds_per_pass(grad_fn: Callable[[Any], Any], params: Any, repeats: int) -> float:
    """Mean seconds of grad_fn(params) after one untimed (compiling) call."""
    jax.block_until_ready(grad_fn(params))
    start = time.perf_counter()
    for _ in range(repeats):
        out = grad_fn(params)
    jax.block_until_ready(out)
    return (time.perf_counter() - start) / repeats


def _loss(
    model: Any, ids: jax.Array, positions: jax.Array, mask: jax.Array, scan_unroll: int, params: Any
) -> jax.Array:
    """Mean negative log-likelihood of ids under params (next-token targets are ids: speed only)."""
    from seal_jax.models import token_logprobs

    logp, _ = token_logprobs(
        params, model.config, ids, positions, mask, ids, scan_unroll=scan_unroll
    )
    return -jnp.mean(logp)


def main() -> None:
    """Prints one table row per (length, attention, layers)."""
    from seal_jax.models import layers as model_layers
    from seal_jax.models import load_hf_checkpoint
    from seal_jax.sft import make_tiny_policy

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", default="512,640", help="tokens per row")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args()
    path = tempfile.mkdtemp()
    make_tiny_policy(path)
    model = load_hf_checkpoint(path, dtype=jnp.float32, compute_dtype=jnp.float32)
    rng, block = np.random.default_rng(0), model_layers.CAUSAL_BLOCK
    print("| tokens | attention | layers | ms per pass | speed-up |")
    print("| ---: | --- | --- | ---: | ---: |")
    for length in map(int, args.lengths.split(",")):
        ids = jnp.asarray(rng.integers(0, model.config.vocab_size, (args.batch, length)))
        positions = jnp.broadcast_to(jnp.arange(length), ids.shape)
        mask = jnp.ones(ids.shape, bool)
        baseline = None
        for attention_block in (length, block):
            model_layers.CAUSAL_BLOCK = attention_block  # read when the pass is traced
            for unroll in (1, 2):
                loss = functools.partial(_loss, model, ids, positions, mask, unroll)
                grad_fn = jax.jit(jax.value_and_grad(loss))
                ms = 1000 * seconds_per_pass(grad_fn, model.params, args.repeats)
                baseline = baseline or ms
                name = "one block" if attention_block == length else f"{block}-query blocks"
                layers = "scanned" if unroll == 1 else "unrolled"
                print(f"| {length} | {name} | {layers} | {ms:.0f} | {baseline / ms:.2f}x |")
    model_layers.CAUSAL_BLOCK = block


if __name__ == "__main__":
    main()
