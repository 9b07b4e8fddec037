"""Cost of one more turn as the history grows: cache continuation versus re-prefilling.

For each history length H, a live row holding H tokens (prompt + a first reply) receives a
--env_tokens environment message and generates a --reply_tokens reply:
  * continue: `Rollout.generate({row: env_ids})` prefills only the new tokens into the live cache
    ("add msg": the same with a 1-token reply, i.e. the cost of appending the message);
  * re-prefill: a fresh rollout whose prompt is the whole history + message, then the reply
    (what an engine without a live cache, or one that re-renders the conversation, pays).
Every shape is compiled by an untimed run first. Random weights, float32, greedy, batch 1.

    python -m benchmarks.bench_multiturn                          # small model, H = 512 .. 8192
    python -m benchmarks.bench_multiturn --shape=qwen2.5-0.5b --histories=512,2048
"""

from __future__ import annotations

import argparse
import resource
import time

import jax
import numpy as np

from seal_jax.models import QwenConfig, init_params
from seal_jax.rollout import EngineConfig, RolloutEngine
from seal_jax.sampler import SamplingParams
from seal_jax.sharding import single_device_mesh

SHAPES = {  # "tiny": the CPU default's policy (configs/tiny.py, the suite's 870 ids)
    "tiny": dict(hidden_size=128, intermediate_size=384, num_layers=2, num_heads=4,
                 num_kv_heads=2, vocab_size=870),
    "small": dict(hidden_size=256, intermediate_size=768, num_layers=4, num_heads=4,
                  num_kv_heads=2, vocab_size=32000),
    "qwen2.5-0.5b": dict(hidden_size=896, intermediate_size=4864, num_layers=24, num_heads=14,
                         num_kv_heads=2, vocab_size=151936),
}  # fmt: skip


def model_config(shape: str) -> QwenConfig:
    """A Qwen2 architecture of the given shape."""
    s = SHAPES[shape]
    return QwenConfig(model_type="qwen2", head_dim=s["hidden_size"] // s["num_heads"],
                      rope_theta=1e6, rms_norm_eps=1e-6, qkv_bias=True, qk_norm=False,
                      tie_word_embeddings=True, max_position_embeddings=32768, **s)  # fmt: skip


def seconds(rollout, step) -> float:
    """Wall time of step(rollout)."""
    start = time.perf_counter()
    step(rollout)
    return time.perf_counter() - start


def main() -> None:
    """Prints both cost curves."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="small", choices=list(SHAPES))
    parser.add_argument("--histories", default="512,1024,2048,4096,8192")
    parser.add_argument("--env_tokens", type=int, default=64)
    parser.add_argument("--reply_tokens", type=int, default=32)
    parser.add_argument("--context_limit", type=int, default=16384)
    args = parser.parse_args()
    cfg = model_config(args.shape)
    params = init_params(cfg, jax.random.key(0))
    mesh = single_device_mesh()
    params = jax.device_put(params, jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec()))
    settings = EngineConfig(
        context_limit=args.context_limit,
        max_new_tokens=args.reply_tokens,
        stop_ids=(),
        sampling=SamplingParams("greedy"),
    )
    engine = RolloutEngine(cfg, mesh, settings)
    rng = np.random.default_rng(0)
    env = rng.integers(0, cfg.vocab_size, args.env_tokens).tolist()

    print(f"{args.shape}: +{args.env_tokens} environment tokens, {args.reply_tokens}-token reply")
    print(
        f"{'history':>8} {'add msg ms':>10} {'add msg + reply ms':>18} "
        f"{'re-prefill + reply ms':>21} {'ratio':>6} {'peak RSS GiB':>12}"
    )
    for history in map(int, args.histories.split(",")):
        prompt = rng.integers(0, cfg.vocab_size, history - args.reply_tokens).tolist()

        def conversation(prompt=prompt):  # a live row holding `history` tokens (prompt + reply)
            rollout = engine.start(params, [prompt])
            rollout.generate()
            return rollout

        conversation().generate({0: env})  # compiles the continuation shapes
        t_add = seconds(conversation(), lambda r: r.generate({0: env}, max_new_tokens=1))
        rollout = conversation()
        t_reply = seconds(rollout, lambda r: r.generate({0: env}))
        full = rollout.sequences()[0].token_ids[: history + args.env_tokens].tolist()
        engine.start(params, [full]).generate()  # compiles
        t_reprefill = seconds(engine.start(params, [full]), lambda r: r.generate())
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
        print(
            f"{history:>8} {1e3 * t_add:>10.1f} {1e3 * t_reply:>18.1f} "
            f"{1e3 * t_reprefill:>21.1f} {t_reprefill / t_reply:>6.1f} {peak:>12.2f}",
            flush=True,
        )
    print("compilations:", engine.compile_counts())


if __name__ == "__main__":
    main()
