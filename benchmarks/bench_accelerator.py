"""What to check on one accelerator, in one run: parity, greedy generation, training step time
and MFU, decode against the HBM roofline, and the compile check's memory figures.

    python -m benchmarks.bench_accelerator           # on one GPU (jax[cuda12]) or TPU chip
    python -m benchmarks.bench_accelerator --tiny    # tiny shapes: the default without one

Random weights throughout (nothing is downloaded); the model shapes are Qwen2.5-0.5B's and
-1.5B's (benchmarks/bench_generate.py's SHAPES). One line per figure:

  parity    the 0.5B shape built with transformers against transformers on this machine (torch
            on CUDA when it has it, else on the CPU), over the valid tokens of a padded batch:
            max and mean |logit difference| and how often the argmax agrees; float32 with the
            "highest" matmul precision on both sides (jax's default on a GPU is TF32), and bf16
            compute against torch's float32, beside torch's own bf16 against its float32.
  greedy    the rollout engine's greedy tokens (float32) against transformers `generate`: rows
            identical, and the first token where a row differs.
  train     one update step (forward, backward, Adam) of configs/qwen.py's setting (fp32 master
            weights, bf16 compute, remat, KL term) on one micro-batch, 0.5B and 1.5B shapes:
            seconds per step after the compiling one, and MFU = 3 x forward FLOPs / step time /
            peak bf16 FLOP/s, forward FLOPs from seal_jax.estimate.forward_flops (2 x matmul
            parameters x tokens + causal attention); remat's recomputation is not counted.
  decode    the rollout engine's decode tokens/s (bf16 weights and cache) against the HBM
            roofline: rows x peak HBM bytes/s / bytes read per decode step (the bf16 weights but
            the input embedding, and every row's KV cache at its mean length).
  compile   `run.py --mode=compile`'s table for this machine's devices: configs/colab_tpu.py's
            0.5b-v5e-1 setting (16k context) compiled for them, the memory per program from
            XLA's memory analysis (no libtpu needed).

Peak bf16 FLOP/s and HBM bandwidth are vendor figures by jax device kind (CHIPS below, TPUs from
seal_jax/estimate.py); a kind without figures prints no MFU or roofline.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import os
import tempfile
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import bench_generate
from seal_jax import estimate

# Vendor figures by jax device_kind substring, first match: (dense bf16 FLOP/s, HBM bytes/s).
CHIPS = (
    ("H100 PCIe", 756e12, 2.0e12),
    ("H100 NVL", 835e12, 3.9e12),
    ("H100", 989e12, 3.35e12),  # SXM ("NVIDIA H100 80GB HBM3")
    ("H200", 989e12, 4.8e12),
    ("A100-SXM4-80GB", 312e12, 2.039e12),
    *((kind, chip.peak_flops, chip.hbm_bandwidth) for kind, chip in estimate.CHIPS.items()),
)


@dataclasses.dataclass(frozen=True)
class Sizes:
    """What one run measures: shapes (bench_generate.SHAPES) and lengths."""

    parity_shape: str
    train_shapes: tuple[str, ...]
    parity_len: int  # tokens per row of the padded parity batch
    greedy_rows: int
    greedy_prompt: int
    greedy_new: int
    train_rows: int
    train_len: int
    train_steps: int  # timed, after the compiling one
    decode_rows: int
    decode_prompt: int
    decode_new: int
    compile_context: int  # 0: the Colab setting's own context


FULL = Sizes(
    parity_shape="qwen2.5-0.5b",
    train_shapes=("qwen2.5-0.5b", "qwen2.5-1.5b"),
    parity_len=128,
    greedy_rows=4,
    greedy_prompt=32,
    greedy_new=32,
    train_rows=8,
    train_len=4096,
    train_steps=5,
    decode_rows=64,
    decode_prompt=512,
    decode_new=256,
    compile_context=0,
)
TINY = Sizes(
    parity_shape="tiny",
    train_shapes=("tiny",),
    parity_len=16,
    greedy_rows=2,
    greedy_prompt=8,
    greedy_new=8,
    train_rows=2,
    train_len=64,
    train_steps=2,
    decode_rows=4,
    decode_prompt=16,
    decode_new=16,
    compile_context=256,
)


def chip_figures(kind: str) -> tuple[float, float] | None:
    """(peak bf16 FLOP/s, HBM bytes/s) of a device kind, or None when unknown (e.g. CPU)."""
    return next(((f, b) for name, f, b in CHIPS if name.lower() in kind.lower()), None)


def torch_device() -> str:
    """Where the transformers reference runs: CUDA when torch has it, else the CPU."""
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def _diff(got: np.ndarray, expected: np.ndarray, valid: np.ndarray) -> str:
    d = np.abs(got[valid] - expected[valid])
    agree = (got.argmax(-1) == expected.argmax(-1))[valid].mean()
    return f"max |diff| {d.max():.2e}, mean {d.mean():.2e}, argmax agrees {agree:.2%}"


def parity(path: str, torch_model: Any, sizes: Sizes) -> None:
    """Prints the logit parity lines of the checkpoint at path against its torch model."""
    import torch

    from seal_jax.models import load_hf_checkpoint
    from tests import hf_models

    t = sizes.parity_len
    pads = ((t // 8, 0), (0, t // 5), (0, 0), (t // 16, t // 16))  # left, right, none, both
    ids, positions, mask = hf_models.padded_batch(torch_model.config.vocab_size, 0, t, pads)
    valid = mask.astype(bool)
    expected = hf_models.torch_logits(torch_model, ids, positions, mask)
    with jax.default_matmul_precision("highest"):
        f32 = np.asarray(load_hf_checkpoint(path).logits(ids, positions, mask))
    bf16_model = load_hf_checkpoint(path, dtype=jnp.bfloat16, compute_dtype=jnp.bfloat16)
    bf16 = np.asarray(bf16_model.logits(ids, positions, mask))
    torch_bf16_model = copy.deepcopy(torch_model).to(torch.bfloat16)
    torch_bf16 = hf_models.torch_logits(torch_bf16_model, ids, positions, mask)
    del torch_bf16_model
    where = f"{valid.sum()} tokens, torch on {torch_device()}"
    print(f"parity float32 ({where}): {_diff(f32, expected, valid)}")
    print(f"parity bf16 compute vs torch float32: {_diff(bf16, expected, valid)}")
    print(f"parity torch bf16 vs torch float32 (yardstick): {_diff(torch_bf16, expected, valid)}")


def greedy(path: str, torch_model: Any, sizes: Sizes) -> None:
    """Prints whether the engine's greedy tokens equal transformers `generate`'s (float32)."""
    from seal_jax.models import load_hf_checkpoint

    rng = np.random.default_rng(1)
    vocab = torch_model.config.vocab_size
    prompts = rng.integers(0, vocab, (sizes.greedy_rows, sizes.greedy_prompt))
    new = sizes.greedy_new
    reference = bench_generate.time_torch(torch_model, prompts, new)
    torch_s, expected = reference["total"], reference["ids"]
    with jax.default_matmul_precision("highest"):
        run = bench_generate.time_jax(
            load_hf_checkpoint(path), prompts, new, prompts.shape[1] + new + 1
        )
    got = run["ids"]
    same = (got == expected).all(axis=1)
    first = [int(np.argmax(g != e)) for g, e in zip(got, expected) if (g != e).any()]
    print(
        f"greedy float32, {len(prompts)} prompts x {prompts.shape[1]} tokens, {new} new: "
        f"{same.sum()}/{len(same)} rows identical to transformers generate"
        + (f" (first differing token per differing row: {first})" if first else "")
        + f"; engine {run['total']:.2f} s, transformers {torch_s:.2f} s"
    )


def _train_batch(mesh: Any, rows: int, length: int, vocab: int) -> dict[str, jax.Array]:
    """One micro-batch in seal_jax.rl's layout: random ids, every token in the loss, old and
    reference log-probs of a uniform policy (about those of random weights), advantages +-1."""
    from seal_jax import sharding

    rng = np.random.default_rng(0)
    ids = rng.integers(0, vocab, (rows, length)).astype(np.int32)
    uniform = np.full((rows, length), -np.log(vocab), np.float32)
    batch = {
        "input_ids": ids,
        "positions": np.broadcast_to(np.arange(length, dtype=np.int32), ids.shape),
        "mask": np.ones(ids.shape, bool),
        "targets": np.roll(ids, -1, axis=1),
        "loss_mask": np.ones(ids.shape, bool),
        "old_logprobs": uniform,
        "ref_logprobs": uniform,
        "advantages": rng.choice([-1.0, 1.0], rows).astype(np.float32),
        "loss_norm": np.full((rows,), rows * length, np.float32),
    }
    return {k: jax.device_put(v, sharding.batch_sharding(mesh, v.ndim)) for k, v in batch.items()}


def train(shape: str, sizes: Sizes, peak: float | None) -> None:
    """Prints one update step's time and MFU at a shape (random weights)."""
    from configs import qwen
    from seal_jax import sharding, update
    from seal_jax.models import LoadedModel, QwenConfig, init_params

    cfg = QwenConfig.from_hf_dict(bench_generate.hf_config(shape).to_dict())
    config = qwen.get_config()  # fp32 master weights, bf16 compute, remat, Adam, KL reference
    rows, length = sizes.train_rows, sizes.train_len
    config.train.mini_batch_tasks, config.rl.group_size, config.optim.grad_accum = rows, 1, 1
    mesh = sharding.make_mesh()
    shapes = jax.eval_shape(lambda: init_params(cfg, jax.random.key(0)))
    init = jax.jit(
        lambda: init_params(cfg, jax.random.key(0)),
        out_shardings=sharding.param_shardings(shapes, mesh),
    )
    params = init()
    model = LoadedModel(cfg, params, mesh, "", jnp.bfloat16)
    updater = update.build_updater(config, model)
    opt_state = updater.init_opt_state(params)
    batch = _train_batch(mesh, rows, length, cfg.vocab_size)
    start = time.perf_counter()
    params, opt_state, _ = jax.block_until_ready(updater.step_fn(params, opt_state, batch))
    first = time.perf_counter() - start
    start = time.perf_counter()
    for _ in range(sizes.train_steps):
        params, opt_state, metrics = updater.step_fn(params, opt_state, batch)
    jax.block_until_ready((params, metrics))
    step_s = (time.perf_counter() - start) / sizes.train_steps
    flops = 3 * estimate.forward_flops(cfg, rows, length)
    n = sum(x.size for x in jax.tree.leaves(params))
    mfu = f"MFU {flops / step_s / peak:.1%} of {peak / 1e12:.0f}" if peak else "no MFU: no"
    print(
        f"train {shape} ({n / 1e6:.1f} M parameters), {rows} rows x {length} tokens: "
        f"{step_s:.3f} s per step (the first, compiling: {first:.0f} s), "
        f"{flops / step_s / 1e12:.1f} TFLOP/s ({mfu} peak bf16 TFLOP/s)"
    )


def decode(path: str, sizes: Sizes, bandwidth: float | None) -> None:
    """Prints the engine's decode tokens/s (bf16) against the HBM roofline."""
    from seal_jax.models import load_hf_checkpoint

    model = load_hf_checkpoint(path, dtype=jnp.bfloat16, compute_dtype=jnp.bfloat16)
    cfg, rows, new = model.config, sizes.decode_rows, sizes.decode_new
    prompts = np.random.default_rng(2).integers(0, cfg.vocab_size, (rows, sizes.decode_prompt))
    run = bench_generate.time_jax(model, prompts, new, sizes.decode_prompt + new + 1)
    tokens_s = rows * new / run["decode"]
    mean_len = sizes.decode_prompt + new // 2
    step_bytes = 2 * estimate.matmul_parameters(cfg)  # bf16 weights, the head among them
    step_bytes += rows * estimate.cache_bytes_per_row(cfg, mean_len)["kv"]
    line = (
        f"decode bf16, {rows} rows, {sizes.decode_prompt}-token prompts, {new} new: "
        f"{tokens_s:.0f} tokens/s ({1e3 * run['decode'] / new:.2f} ms per step); "
        f"{step_bytes / 1e9:.2f} GB read per step"
    )
    if bandwidth:
        roofline = rows * bandwidth / step_bytes
        line += f", roofline {roofline:.0f} tokens/s at {bandwidth / 1e12:.2f} TB/s: "
        line += f"{tokens_s / roofline:.0%} of it"
    print(line)


def compile_check(sizes: Sizes) -> None:
    """Prints the compile check of configs/colab_tpu.py:0.5b-v5e-1 for this machine's devices."""
    from configs import colab_tpu
    from seal_jax import aot
    from seal_jax.models import QwenConfig
    from seal_jax.models.config import architecture_from_dir

    config = colab_tpu.get_config("0.5b-v5e-1")
    if sizes.compile_context:  # the tiny run: the same programs at a short context
        config.rollout.context_limit = sizes.compile_context
        config.rollout.max_new_tokens = sizes.compile_context // 4
        config.rollout.prefill_chunk = min(config.rollout.prefill_chunk, sizes.compile_context)
        cfg = QwenConfig.from_hf_dict(bench_generate.hf_config(sizes.parity_shape).to_dict())
    else:
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        cfg = architecture_from_dir(os.path.join(root, "benchmarks/model_configs/qwen2.5-0.5b"))
    print(
        f"compile configs/colab_tpu.py:0.5b-v5e-1 ({config.rollout.context_limit}-token context) "
        "for this machine's devices:"
    )
    with tempfile.TemporaryDirectory() as workdir:
        try:
            aot.check(config, cfg, workdir, topology="")
        except aot.DoesNotFit as error:
            print(f"compile: does not fit: {error}")


def main() -> None:
    """Runs every check and prints its lines."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="tiny shapes (default on CPU)")
    args = parser.parse_args()
    device = jax.devices()[0]
    sizes = TINY if args.tiny or device.platform == "cpu" else FULL
    figures = chip_figures(device.device_kind)
    peak, bandwidth = figures or (None, None)
    print(
        f"device: {jax.device_count()} x {device.device_kind} ({device.platform}), jax "
        f"{jax.__version__}; "
        + (
            f"peak bf16 {peak / 1e12:.0f} TFLOP/s, HBM {bandwidth / 1e12:.2f} TB/s"
            if figures
            else "no peak figures for this kind"
        )
        + ("; tiny shapes" if sizes is TINY else ""),
        flush=True,
    )
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        import torch

        path = os.path.join(tmp, sizes.parity_shape)
        torch_model = bench_generate.build(sizes.parity_shape, path).to(torch_device())
        parity(path, torch_model, sizes)
        greedy(path, torch_model, sizes)
        del torch_model  # its device memory, before the training steps
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        for shape in sizes.train_shapes:
            train(shape, sizes, peak)
        decode(path, sizes, bandwidth)
    compile_check(sizes)
    print(f"done in {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
