"""The update with and without shared prompts: seconds per forward + backward, side by side.

A GRPO group's rollouts all start with the task's prompt. With `train.share_prompt` (the
default) the update runs each prompt once per group and its rows attend to its keys and values;
without, every row carries its own copy. This times the gradient of the token log-probs (the
update's model work) for both layouts of the same random batch: --groups x --group_size rows, a
prompt of about --prompt_len tokens per group and about --response_len tokens after it per row
(lengths drawn within +-25%, padded to multiples of 128 as the trainer does). One untimed call
compiles each; the figure is the mean of --repeats calls.

    python -m benchmarks.bench_shared_prompt
    python -m benchmarks.bench_shared_prompt --shape=small --prompt_len=2048
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.bench_multiturn import SHAPES, model_config
from seal_jax.models import init_params, token_logprobs
from seal_jax.trajectories import padded_length

BUCKET = 128


def batches(args: argparse.Namespace, vocab: int) -> tuple[dict, dict]:
    """The same rows as whole sequences and as shared prompts plus continuations."""
    rng = np.random.default_rng(0)
    g, r = args.groups, args.group_size

    def around(n: int, size: int) -> np.ndarray:
        return rng.integers(max(2, int(n * 0.75)), int(n * 1.25) + 1, size)

    prompts = [rng.integers(1, vocab, n) for n in around(args.prompt_len, g)]
    rests = [rng.integers(1, vocab, n) for n in around(args.response_len, g * r)]
    rows = [np.concatenate([prompts[i // r], rest]) for i, rest in enumerate(rests)]
    tails = [row[len(prompts[i // r]) - 1 :] for i, row in enumerate(rows)]
    starts = np.repeat([len(p) - 1 for p in prompts], r)
    whole = _layout(rows, np.zeros(g * r, np.int64))
    shared = _layout(tails, starts)
    shared["prompt"] = _layout([p[:-1] for p in prompts], np.zeros(g, np.int64))
    return whole, shared


def _layout(seqs: list[np.ndarray], starts: np.ndarray) -> dict:
    """Right-padded ids, positions (from `starts`), mask and next-token targets."""
    width = padded_length([len(s) for s in seqs], BUCKET)
    ids = np.zeros((len(seqs), width), np.int32)
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = s
    mask = np.arange(width)[None, :] < np.asarray([len(s) for s in seqs])[:, None]
    positions = (starts[:, None] + np.arange(width)[None, :]).astype(np.int32)
    return dict(ids=ids, positions=positions, mask=mask, targets=np.roll(ids, -1, axis=1))


def seconds(fn, params, repeats: int) -> float:
    """Mean wall time of fn(params) after one compiling call."""
    jax.block_until_ready(fn(params))
    start = time.perf_counter()
    for _ in range(repeats):
        jax.block_until_ready(fn(params))
    return (time.perf_counter() - start) / repeats


def main() -> None:
    """Prints one table row per layout and the ratio."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="tiny", choices=list(SHAPES))
    parser.add_argument("--groups", type=int, default=2)
    parser.add_argument("--group_size", type=int, default=8)
    parser.add_argument("--prompt_len", type=int, default=300)
    parser.add_argument("--response_len", type=int, default=150)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    cfg = model_config(args.shape)
    params = init_params(cfg, jax.random.key(0))
    whole, shared = batches(args, cfg.vocab_size)

    def grad_fn(batch: dict, prompt: dict | None):
        extra = (
            {}
            if prompt is None
            else {"prompt": tuple(prompt[k] for k in ("ids", "positions", "mask"))}
        )

        def loss(p):
            logp, _ = token_logprobs(p, cfg, batch["ids"], batch["positions"], batch["mask"],
                                     batch["targets"], **extra)  # fmt: skip
            return jnp.sum(logp * batch["mask"])

        return jax.jit(jax.grad(loss))

    print(f"{args.shape}: {args.groups} groups x {args.group_size} rows, prompts ~{args.prompt_len}"
          f" tokens, ~{args.response_len} after them per row")  # fmt: skip
    print("| layout | tokens run | s per forward + backward |")
    print("| --- | ---: | ---: |")
    times = {}
    for name, batch, prompt in (
        ("whole rows", whole, None),
        ("shared prompts", shared, shared["prompt"]),
    ):
        times[name] = seconds(grad_fn(batch, prompt), params, args.repeats)
        tokens = batch["ids"].size + (0 if prompt is None else prompt["ids"].size)
        print(f"| {name} | {tokens} | {times[name]:.3f} |")
    print(f"speed-up: {times['whole rows'] / times['shared prompts']:.2f}x")


if __name__ == "__main__":
    main()
