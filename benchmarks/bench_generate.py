"""Greedy generation: this engine versus transformers + torch `generate`, on CPU, side by side.

Both run the same model (float32; a random-weight one built with transformers, or a real
checkpoint: --checkpoint), the same random prompts, exactly N new tokens per row (no stop ids),
one untimed warm-up run each (two new tokens for torch, which compiles nothing). Per row of the
table: B rows of P-token prompts, N new tokens, the engine's context limit (default P + N + 1);
the engine's time is split into its prefill and decode programs. "jax compile s" is the time JAX
spent tracing, lowering and compiling during the engine's warm-up run, as JAX itself reports it
(`jax.monitoring` events). The first line gives the machine's float32 matmul rate at a prefill
call's shape (a batch of prompt chunks), the yardstick of "prefill GFLOP/s" (2 x tokens x
non-embedding parameters / prefill time). "rows equal" counts the rows whose greedy tokens are
the same in both engines.

    python -m benchmarks.bench_generate                      # small + qwen2.5-0.5b, batch 1 and 16
    python -m benchmarks.bench_generate --models=small --batches=1,16,64 --new_tokens=128
    # real weights at real lengths (import the GGUF first: seal_jax.models.import_gguf)
    python -m benchmarks.bench_generate --checkpoint=DIR --shapes=1:512:96,2:3000:96,16:512:96
    # cost follows live lengths: one shape at several context limits (engine only)
    python -m benchmarks.bench_generate --checkpoint=DIR --shapes=2:3000:96 \
        --context_limits=4096,12288,32768 --skip_torch
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
    # A tiny Qwen2 for checks on CPU (seconds).
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, vocab_size=512,
                 tie_word_embeddings=True),
    # A small Qwen2: quick to run, shows per-step overheads.
    "small": dict(hidden_size=256, intermediate_size=768, num_hidden_layers=4,
                  num_attention_heads=4, num_key_value_heads=2, vocab_size=32000,
                  tie_word_embeddings=True),
    # The shape of Qwen2.5-0.5B(-Instruct) (about 494M parameters).
    "qwen2.5-0.5b": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                         num_attention_heads=14, num_key_value_heads=2, vocab_size=151936,
                         tie_word_embeddings=True),
    # The shape of Qwen2.5-1.5B(-Instruct) (about 1.54B parameters).
    "qwen2.5-1.5b": dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                         num_attention_heads=12, num_key_value_heads=2, vocab_size=151936,
                         tie_word_embeddings=True),
}  # fmt: skip


def peak_rss_gib() -> float:
    """Peak resident memory of this process so far, GiB."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def hf_config(shape: str):
    """The transformers Qwen2Config of `shape` (Qwen2.5's rope theta and context)."""
    import transformers

    return transformers.Qwen2Config(
        max_position_embeddings=32768,
        rope_parameters={"rope_type": "default", "rope_theta": 1e6},
        **SHAPES[shape],
    )


def build(shape: str, path: str):
    """Saves a random-weight transformers Qwen2 of `shape` at path; returns it."""
    import torch
    import transformers

    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(hf_config(shape)).eval()
    model.save_pretrained(path)
    return model


def time_torch(model, prompts: np.ndarray, new_tokens: int) -> dict:
    """transformers greedy `generate` (after a two-token warm-up run) on the model's device:
    {"total", "prefill"} seconds (prefill: its first forward pass, the prompt's) and "ids" (the
    generated ids [B, new_tokens])."""
    import torch

    ids = torch.tensor(prompts, dtype=torch.long, device=model.device)
    kwargs = dict(
        max_new_tokens=new_tokens,
        min_new_tokens=new_tokens,
        do_sample=False,
        eos_token_id=None,
        pad_token_id=0,
        attention_mask=torch.ones_like(ids),
    )
    forwards = []  # (start, end) of every forward pass of the timed run
    pre = model.register_forward_pre_hook(lambda *_: forwards.append([time.perf_counter()]))
    post = model.register_forward_hook(lambda *_: forwards[-1].append(time.perf_counter()))
    with torch.no_grad():
        # Warm-up at the same shapes: torch compiles nothing, so two new tokens suffice.
        model.generate(ids, **{**kwargs, "max_new_tokens": 2, "min_new_tokens": 2})
        forwards.clear()
        start = time.perf_counter()
        out = model.generate(ids, **kwargs)
        elapsed = time.perf_counter() - start
    pre.remove()
    post.remove()
    assert out.shape[1] == prompts.shape[1] + new_tokens
    prefill = forwards[0][1] - forwards[0][0]
    return {"total": elapsed, "prefill": prefill, "ids": out[:, prompts.shape[1] :].cpu().numpy()}


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


def time_jax(model, prompts: np.ndarray, new_tokens: int, context_limit: int) -> dict:
    """The engine's greedy generation (in the model's compute dtype) after a warm-up run:
    {"total", "prefill", "decode"} seconds (prefill and decode: the time in those device
    programs), "compile" (seconds JAX spent compiling during the warm-up run) and "ids" (the
    generated ids [B, new_tokens])."""
    import jax

    from seal_jax.rollout import EngineConfig, RolloutEngine
    from seal_jax.sampler import SamplingParams

    config = EngineConfig(
        context_limit=context_limit,
        max_new_tokens=new_tokens,
        stop_ids=(),
        sampling=SamplingParams("greedy"),
        min_cache_len=64,
    )
    engine = RolloutEngine(model.config, model.mesh, config, model.compute_dtype)
    spent = {"prefill": 0.0, "decode": 0.0}
    call = engine.call

    def timed_call(name: str, *args: Any) -> Any:
        start = time.perf_counter()
        out = jax.block_until_ready(call(name, *args))
        if name in spent:
            spent[name] += time.perf_counter() - start
        return out

    engine.call = timed_call

    def generate() -> dict:
        return engine.start(model.params, prompts.tolist()).generate()

    compile_s = compile_seconds(generate)  # the warm-up run compiles every program
    spent.update(prefill=0.0, decode=0.0)
    start = time.perf_counter()
    turns = generate()
    elapsed = time.perf_counter() - start
    assert all(len(t.ids) == new_tokens for t in turns.values())
    ids = np.array([turns[row].ids for row in sorted(turns)])
    return {"total": elapsed, "compile": compile_s, **spent, "ids": ids}


def matmul_gflops(rows: int, inner: int, cols: int, repeats: int = 10) -> float:
    """The machine's float32 rate for a plain jnp matmul [rows, inner] x [inner, cols]."""
    import jax
    import jax.numpy as jnp

    a, b = jnp.ones((rows, inner)), jnp.ones((inner, cols))
    matmul = jax.jit(jnp.matmul)
    matmul(a, b).block_until_ready()
    start = time.perf_counter()
    for _ in range(repeats):
        matmul(a, b).block_until_ready()
    return 2 * rows * inner * cols * repeats / (time.perf_counter() - start) / 1e9


def layer_parameters(config) -> int:
    """Parameters of a model's decoder layers (what a prefill token multiplies through)."""
    e, f = config.hidden_size, config.intermediate_size
    attention = e * config.head_dim * (2 * config.num_heads + 2 * config.num_kv_heads)
    return config.num_layers * (attention + 3 * e * f)


def parse_shapes(args: argparse.Namespace) -> list[tuple[int, int, int]]:
    """(batch, prompt, new tokens) rows: --shapes B:P:N,... or --batches x --prompt_len x
    --new_tokens."""
    if args.shapes:
        return [tuple(map(int, shape.split(":"))) for shape in args.shapes.split(",")]
    return [(b, args.prompt_len, args.new_tokens) for b in map(int, args.batches.split(","))]


def models(args: argparse.Namespace, tmp: str):
    """Yields (name, checkpoint dir, torch model or None) for each model to measure."""
    import transformers

    if args.checkpoint:
        torch_model = None
        if not args.skip_torch:
            torch_model = transformers.AutoModelForCausalLM.from_pretrained(args.checkpoint)
            torch_model.eval()
        yield args.checkpoint.rstrip("/").split("/")[-1], args.checkpoint, torch_model
        return
    for shape in args.models.split(","):
        path = f"{tmp}/{shape}"
        yield shape, path, build(shape, path)


def main() -> None:
    """Prints the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="small,qwen2.5-0.5b")
    parser.add_argument("--checkpoint", default="", help="a Hugging Face directory instead")
    parser.add_argument("--batches", default="1,16")
    parser.add_argument("--prompt_len", type=int, default=32)
    parser.add_argument("--new_tokens", type=int, default=32)
    parser.add_argument("--shapes", default="", help="B:P:N,... instead of the three above")
    parser.add_argument("--context_limits", default="", help="engine limits to try (def. P+N+1)")
    parser.add_argument("--skip_torch", action="store_true")
    args = parser.parse_args()
    import torch

    from seal_jax.models import load_hf_checkpoint
    from seal_jax.rollout import EngineConfig

    shapes = parse_shapes(args)
    # The rows of one prefill call's products: a batch of prompt chunks.
    rows = max(b * min(p, EngineConfig.prefill_chunk) for b, p, _ in shapes)
    print(f"torch threads {torch.get_num_threads()}; tokens/s = batch * new tokens / wall time")
    header = (
        f"{'model':>14} {'batch':>5} {'prompt':>6} {'new':>4} {'context':>7} {'torch s':>8} "
        f"{'torch prefill s':>15} "
        f"{'jax s':>7} {'jax/torch':>9} {'jax prefill s':>13} {'prefill GFLOP/s':>15} "
        f"{'jax decode s':>12} {'decode ms/tok':>13} {'jax compile s':>13} {'peak RSS GiB':>12} "
        f"{'rows equal':>10}"
    )
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as tmp:
        for name, path, torch_model in models(args, tmp):
            model = load_hf_checkpoint(path)
            cfg = model.config
            rate = matmul_gflops(min(rows, 8192), cfg.hidden_size, cfg.intermediate_size)
            print(
                f"{name}: jnp matmul [{min(rows, 8192)}, {cfg.hidden_size}] x "
                f"[{cfg.hidden_size}, {cfg.intermediate_size}] float32: {rate:.0f} GFLOP/s"
            )
            print(header)
            for batch, prompt_len, new in shapes:
                prompts = rng.integers(0, cfg.vocab_size, (batch, prompt_len))
                torch_t = {"total": float("nan"), "prefill": float("nan"), "ids": None}
                if torch_model is not None:
                    torch_t = time_torch(torch_model, prompts, new)
                t_torch, torch_ids = torch_t["total"], torch_t["ids"]
                limits = args.context_limits or str(prompt_len + new + 1)
                for limit in map(int, limits.split(",")):
                    if limit < prompt_len + new + 1:
                        continue  # the engine refuses a prompt and reply that cannot fit
                    t = time_jax(model, prompts, new, limit)
                    flops = 2 * batch * prompt_len * layer_parameters(cfg)
                    same = "-"
                    if torch_ids is not None:
                        same = f"{int((torch_ids == t['ids']).all(axis=1).sum())}/{batch}"
                    print(
                        f"{name:>14} {batch:>5} {prompt_len:>6} {new:>4} {limit:>7} "
                        f"{t_torch:>8.2f} {torch_t['prefill']:>15.2f} {t['total']:>7.2f} "
                        f"{t_torch / t['total']:>9.2f} "
                        f"{t['prefill']:>13.2f} {flops / t['prefill'] / 1e9:>15.0f} "
                        f"{t['decode']:>12.2f} {1e3 * t['decode'] / new:>13.1f} "
                        f"{t['compile']:>13.1f} {peak_rss_gib():>12.2f} {same:>10}",
                        flush=True,
                    )


if __name__ == "__main__":
    main()
