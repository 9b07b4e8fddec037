"""The one place that picks a decoder family by config: `DenseDecoder` (Qwen2/2.5/3, Llama 3;
`qwen_llama`) or `Qwen35` (Qwen3.5's hybrid; `qwen35`), and the functional entry points built on
it (random parameters, caches, logits, log-probabilities). Families never import this module."""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from seal_jax.models import qwen35, qwen_llama
from seal_jax.models.config import Qwen35Config, QwenConfig
from seal_jax.models.layers import Cache, Params, SharedPrompt


def model_class(cfg: QwenConfig | Qwen35Config) -> type[nn.Module]:
    """The Flax module of an architecture: `Qwen35` for a Qwen3.5 config, else `DenseDecoder`
    (both with the same interface)."""
    return qwen35.Qwen35 if isinstance(cfg, Qwen35Config) else qwen_llama.DenseDecoder


def decoding_module(cfg: QwenConfig | Qwen35Config, params: Params, dtype: Any) -> nn.Module:
    """The module that runs `params` with compute dtype `dtype`: a dense decoder's per-layer
    parameters (`qwen_llama.unstack_layers`) run layer by layer, stacked ones as one scan."""
    if "layers" in params:
        return model_class(cfg)(cfg, dtype=dtype)
    return qwen_llama.DenseDecoder(cfg, dtype=dtype, scan_layers=False)


def init_cache(
    cfg: QwenConfig | Qwen35Config,
    batch: int,
    length: int,
    dtype: Any = jnp.float32,
    per_row: bool = False,
) -> Cache:
    """An empty cache of the config's family for `batch` rows and `length` slots (nothing valid,
    index 0); per_row: a write pointer per row. Qwen3.5's adds the linear layers' states."""
    family = qwen35 if isinstance(cfg, Qwen35Config) else qwen_llama
    return family.init_cache(cfg, batch, length, dtype, per_row)


def init_params(
    cfg: QwenConfig, rng: jax.Array, param_dtype: Any = jnp.float32, seq_len: int = 8
) -> Params:
    """Random parameters (normal(0.02) kernels, unit norms) for tests and from-scratch models."""
    model = model_class(cfg)(cfg, param_dtype=param_dtype)
    ids = jnp.zeros((1, seq_len), jnp.int32)
    variables = model.init(rng, ids, jnp.arange(seq_len)[None], jnp.ones((1, seq_len), bool))
    return variables["params"]


def forward_logits(
    params: Params,
    cfg: QwenConfig,
    input_ids: jax.Array,
    positions: jax.Array,
    mask: jax.Array,
    cache: Cache | None = None,
    *,
    dtype: Any = jnp.float32,
) -> tuple[jax.Array, Cache | None]:
    """float32 logits [B, T, V] for (input_ids, positions, mask) [B, T], and the updated cache."""
    model = model_class(cfg)(cfg, dtype=dtype)
    return model.apply({"params": params}, input_ids, positions, mask, cache, method="logits")


def token_logprobs(
    params: Params,
    cfg: QwenConfig,
    input_ids: jax.Array,
    positions: jax.Array,
    mask: jax.Array,
    targets: jax.Array,
    *,
    dtype: Any = jnp.float32,
    chunk: int = 512,
    remat: bool = False,
    with_entropy: bool = False,
    attn_chunk: int = 1024,
    mlp_chunk: int = 0,
    scan_unroll: int = 1,
    prompt: SharedPrompt | None = None,
    attention: str = "xla",
) -> tuple[jax.Array, jax.Array | None]:
    """log p(targets[b,t] | input_ids[b, :t+1]) as float32 [B, T], plus entropies if asked.

    Never materialises [B, T, V] logits: the vocabulary projection runs `chunk` positions at a time.
    For next-token training, pass targets = input_ids shifted left by one. prompt: a prompt
    shared by each group of consecutive rows, computed once per group (`SharedPrompt`); the
    rows' input_ids then hold only what follows it.
    """
    model = model_class(cfg)(
        cfg,
        dtype=dtype,
        remat=remat,
        attn_chunk=attn_chunk,
        mlp_chunk=mlp_chunk,
        scan_unroll=scan_unroll,
        attention=attention,
    )
    return model.apply(
        {"params": params},
        input_ids,
        positions,
        mask,
        targets,
        chunk,
        with_entropy,
        prompt,
        method="token_logprobs",
    )
