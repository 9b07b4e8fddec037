"""The KV cache is updated in place by the compiled decode loop (issue 34): the donated cache's
buffers become the output's, each layer writes its own slots into the whole cache carried
through the layer scan, and the program's temporaries hold no cache-sized copy.

The TPU compiler's copy does not show on CPU (its compiler keeps the cache's layout either way),
so the CPU test also checks the structure that removed it: every cache write indexes the layer
axis (one layer's slots; one write of all layers' keys after the layer scan made the TPU compiler
lay the cache out with the layer axis inside the write, and copy it whole per token). The TPU
test compiles for an abstract v5e chip when libtpu is importable (`PYTHONPATH=<libtpu's
directory>`) and checks the temporaries themselves."""

from __future__ import annotations

import importlib.util
import re

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import SingleDeviceSharding

from seal_jax.models import init_cache, init_params, model_class
from seal_jax.models.config import Qwen35Config, QwenConfig

LAYERS = 8


def _config(kind: str, layers: int = LAYERS, width: int = 64, head_dim: int = 32):
    """A small Qwen2 or Qwen3.5 (linear, full, linear, full, ...) config."""
    common = dict(
        vocab_size=128,
        hidden_size=width,
        intermediate_size=2 * width,
        num_layers=layers,
        num_heads=4,
        num_kv_heads=2,
        head_dim=head_dim,
        rope_theta=1e4,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        max_position_embeddings=1 << 15,
    )
    if kind == "qwen":
        return QwenConfig(model_type="qwen2", qkv_bias=True, qk_norm=False, **common)
    return Qwen35Config(
        model_type="qwen3_5_text",
        rotary_dim=head_dim // 2,
        layer_types=("linear_attention", "full_attention") * (layers // 2),
        conv_kernel=4,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        linear_key_head_dim=16,
        linear_value_head_dim=16,
        **common,
    )


def _decode_loop(cfg, dtype, tokens: int = 8):
    """A jitted greedy decode loop as the rollout's (`seal_jax.rollout.decode_segment`): the
    model's cached call per token in a while loop with the cache in its state, the cache
    donated. (params, cache, first tokens [B]) -> (cache, last tokens)."""
    model = model_class(cfg)(cfg, dtype=dtype)

    def decode(params, cache, tok):
        def step(state):
            i, tok, cache = state
            feed = jnp.ones((tok.shape[0], 1), bool)
            position = cache["index"][:, None]
            logits, cache = model.apply(
                {"params": params}, tok[:, None], position, feed, cache, method="logits"
            )
            return i + 1, jnp.argmax(logits[:, 0], axis=-1).astype(jnp.int32), cache

        _, tok, cache = jax.lax.while_loop(lambda s: s[0] < tokens, step, (0, tok, cache))
        return cache, tok

    return jax.jit(decode, donate_argnums=(1,))


def _abstract(cfg, rows: int, slots: int, dtype, sharding=None):
    """Abstract (params, cache, tokens) of the decode loop."""
    params = jax.eval_shape(lambda: init_params(cfg, jax.random.key(0)))
    cache = jax.eval_shape(lambda: init_cache(cfg, rows, slots, dtype, per_row=True))
    tokens = jax.ShapeDtypeStruct((rows,), jnp.int32)
    return jax.tree.map(
        lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sharding), (params, cache, tokens)
    )


def _kv_bytes(cache) -> int:
    return sum(cache[n].size * jnp.dtype(cache[n].dtype).itemsize for n in ("k", "v"))


@pytest.mark.parametrize("kind", ["qwen", "qwen35"])
def test_decode_writes_the_cache_in_place(kind):
    cfg = _config(kind)
    params, cache, tokens = _abstract(cfg, rows=4, slots=512, dtype=jnp.float32)
    compiled = _decode_loop(cfg, jnp.float32).lower(params, cache, tokens).compile()
    memory, hlo = compiled.memory_analysis(), compiled.as_text()
    kv = _kv_bytes(cache)

    assert memory.alias_size_in_bytes >= kv  # the output cache is the donated one
    assert memory.temp_size_in_bytes < kv / 2
    shape = re.escape(f"f32[{','.join(map(str, cache['k'].shape))}]")
    assert not re.search(shape + r"\S* copy\(", hlo)
    # Each write into k or v scatters into one layer: the layer axis (0) is a scatter index.
    writes = re.findall(shape + r"\S* scatter\(.*scatter_dims_to_operand_dims=\{([\d,]*)\}", hlo)
    assert len(writes) == 2 and all("0" in dims.split(",") for dims in writes), writes

    # Run on real arrays: the donated cache's buffers are taken over by the output.
    real = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), (params, cache, tokens))
    out, _ = compiled(*real)
    assert real[1]["k"].is_deleted() and real[1]["v"].is_deleted()
    assert int(out["index"][0]) == 8


@pytest.mark.skipif(importlib.util.find_spec("libtpu") is None, reason="needs libtpu")
@pytest.mark.parametrize("kind", ["qwen", "qwen35"])
def test_tpu_decode_temporaries_hold_no_cache_copy(kind):
    from seal_jax import aot

    device = aot.target_devices("v5e:1x1")[0]
    cfg = _config(kind, layers=8, width=512, head_dim=128)
    # A k + v cache of 1 GiB (qwen; 512 MiB for qwen35's four full layers), too large for
    # on-chip memory as a real one is. Before the fix the temporaries were 1.54 and 0.79 GiB.
    args = _abstract(
        cfg, rows=16, slots=8192, dtype=jnp.bfloat16, sharding=SingleDeviceSharding(device)
    )
    compiled = _decode_loop(cfg, jnp.bfloat16).lower(*args).compile()
    assert compiled.memory_analysis().temp_size_in_bytes < _kv_bytes(args[1]) / 8
