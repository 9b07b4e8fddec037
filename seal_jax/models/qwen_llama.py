"""The dense decoder of Qwen2 / Qwen2.5 / Qwen3 and Llama 3 (Flax linen), with an optional KV cache.

The families differ only in config fields (q/k/v biases, q/k norms, Llama 3.1 rope scaling,
tied embeddings); `seal_jax.models.architectures` picks this module or `qwen35` by config. Shared
layers live in `seal_jax.models.layers`.

Layers are stacked with `nn.scan` (one compiled layer body, parameters with a leading layer axis),
optionally rematerialised or unrolled (`scan_unroll`). Parameter names follow Hugging Face so
checkpoint mapping stays trivial: `embed_tokens`,
`layers/{self_attn,mlp,input_layernorm,post_attention_layernorm}`, `norm`, `lm_head`.

Inputs are explicit: `input_ids [B, T]`, `positions [B, T]` (RoPE positions) and `mask [B, T]`
(1 for real tokens). A key is visible to a query when it sits at the same or an earlier slot and
is a real token, so left padding, right padding and padding in the middle of a cache all work.

KV cache (see `init_cache`): `{"k", "v": [L, B, KVH, S, D], "mask": [B, S] bool, "index": int32}`.
Heads come before slots so that one row's keys of one head are contiguous: decode attention is
then a batched matrix product over (row, head), and a decode step on CPU takes ~0.55x the time it
took with slots before heads (benchmarks/README.md, "KV cache layout").
A call with a cache writes its T new tokens at slots `index .. index + T - 1` (same for every row)
and advances `index`; queries attend to every valid cached slot before `index` and, causally, to
the call's own real tokens. The k and v caches are the layer scan's carry, whole: layer l writes
its new keys and values at layer l of the carried buffers (`write_layer_cache`) and then reads
its slice, so a donated cache is updated in place. (Scanned as per-layer inputs with all layers'
new keys written after the scan, the TPU compiler copied the whole cache into another layout per
token; benchmarks/README.md, "In-place KV cache (decode)".)

Per-row write pointers (decoding, `init_cache(..., per_row=True)`): `index` is int32 [B] and row b
writes its T tokens at slots `index[b] ..` (writes past the end are dropped) and advances by its
number of real tokens, so chunks must be right-padded. Then a row's slot equals its token count and
the cache needs no more slots than the longest row, however ragged the rows are.
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from seal_jax.models.config import QwenConfig
from seal_jax.models.layers import (
    CACHE_AXES,
    Cache,
    CausalLMHead,
    Mlp,
    RMSNorm,
    SharedPrompt,
    apply_rope,
    cached_attention,
    cached_visibility,
    causal_attention,
    dense,
    rope_tables,
    splash_causal_attention,
    write_cache,
)
from seal_jax.sharding import constrain


class SelfAttention(nn.Module):
    """GQA self-attention with RoPE, optional q/k RMSNorm (Qwen3) and q/k/v biases (Qwen2)."""

    cfg: QwenConfig
    dtype: Any
    param_dtype: Any
    attn_chunk: int = 1024
    attention: str = "xla"

    @nn.compact
    def __call__(
        self, x: jax.Array, cache: Any, layer_input: Any, ctx: dict
    ) -> tuple[jax.Array, Any, Any]:
        """x [B,T,E] -> (attention output [B,T,E], the cache, this layer's (k, v) or None).

        cache: the whole (k, v) cache [L, B, KVH, S, D] when decoding (returned with this
        layer's new keys and values written), else None. layer_input: this layer's index when
        decoding, the shared prompt's (k, v) when ctx has "prefix_mask", else None. This layer's
        (k, v) come back when ctx has "return_kv".
        """
        cfg, dt, pdt = self.cfg, self.dtype, self.param_dtype
        b, t, _ = x.shape
        hd = cfg.head_dim
        q = dense(cfg.num_heads * hd, "q_proj", dt, pdt, cfg.qkv_bias)(x)
        k = dense(cfg.num_kv_heads * hd, "k_proj", dt, pdt, cfg.qkv_bias)(x)
        v = dense(cfg.num_kv_heads * hd, "v_proj", dt, pdt, cfg.qkv_bias)(x)
        q = constrain(q.reshape(b, t, cfg.num_heads, hd), "batch", None, "heads", None)
        k = constrain(k.reshape(b, t, cfg.num_kv_heads, hd), "batch", None, "heads", None)
        v = constrain(v.reshape(b, t, cfg.num_kv_heads, hd), "batch", None, "heads", None)
        if cfg.qk_norm:
            q = RMSNorm(cfg.rms_norm_eps, dt, pdt, name="q_norm")(q)
            k = RMSNorm(cfg.rms_norm_eps, dt, pdt, name="k_norm")(k)
        q = apply_rope(q, ctx["cos"], ctx["sin"])
        k = apply_rope(k, ctx["cos"], ctx["sin"])
        kv = (k, v) if "return_kv" in ctx else None
        if "prefix_mask" in ctx:  # training on a shared prompt
            prefix = (*layer_input, ctx["prefix_mask"])
            out = causal_attention(q, k, v, ctx["key_mask"], self.attn_chunk, prefix)
        elif cache is not None:
            out, cache = cached_attention(q, k.astype(dt), v.astype(dt), cache, layer_input, ctx)
        elif self.attention == "xla":
            out = causal_attention(q, k, v, ctx["key_mask"], self.attn_chunk)
        else:
            interpret = self.attention == "splash_interpret"
            out = splash_causal_attention(q, k, v, ctx["key_mask"], interpret)
        out = constrain(out, "batch", None, "heads", None).reshape(b, t, cfg.num_heads * hd)
        return dense(cfg.hidden_size, "o_proj", dt, pdt)(out), cache, kv


class DecoderLayer(nn.Module):
    """One pre-norm decoder block; scanned over layers with the whole KV cache in the carry."""

    cfg: QwenConfig
    dtype: Any
    param_dtype: Any
    attn_chunk: int = 1024
    mlp_chunk: int = 0
    attention: str = "xla"

    @nn.compact
    def __call__(self, carry: tuple, layer_input: Any, ctx: dict) -> tuple[tuple, Any]:
        """carry (x [B,T,E], the whole (k, v) cache or None) -> (the carry after this layer,
        this layer's (k, v) or None); layer_input and the cache as in `SelfAttention`."""
        x, cache = carry
        eps, dt, pdt = self.cfg.rms_norm_eps, self.dtype, self.param_dtype
        x = constrain(x, "batch", None, None)
        h = RMSNorm(eps, dt, pdt, name="input_layernorm")(x)
        attn = SelfAttention(self.cfg, dt, pdt, self.attn_chunk, self.attention, name="self_attn")
        a, cache, kv = attn(h, cache, layer_input, ctx)
        x = constrain(x + a, "batch", None, None)
        h = RMSNorm(eps, dt, pdt, name="post_attention_layernorm")(x)
        x = constrain(
            x + Mlp(self.cfg, dt, pdt, self.mlp_chunk, name="mlp")(h), "batch", None, None
        )
        return (x, cache), kv


class DenseDecoder(CausalLMHead, nn.Module):
    """The causal LM trunk: returns final hidden states (normed) and the updated cache.

    Attributes:
      cfg: architecture.
      dtype: compute dtype (activations, matmuls).
      param_dtype: dtype parameters are created in (loading casts to it as well).
      remat: rematerialise each layer in the backward pass (training memory).
      attn_chunk: queries per attention block on uncached calls (bounds [T, T] score memory).
      mlp_chunk: positions per feed-forward block on long sequences (`Mlp`; 0: whole sequence).
      attention: the attention of uncached passes, one of ATTENTION_KERNELS.
      scan_unroll: layers per iteration of the layer scan (the layer count unrolls it: faster
        training passes for a shallow model on CPU, longer compiles for a deep one; slower
        cached decoding on CPU).
      scan_layers: run the layers as one scan over stacked parameters (`layers`, leading layer
        axis); False runs them one by one from per-layer parameters (`layer_list_0`,
        `layer_list_1`, ...; `unstack_layers`): XLA's CPU dots then read each weight where it
        lies, where a scan copies every layer's weights out of the stack first (benchmarks/
        README.md, "The engine at real prompt lengths").
    """

    cfg: QwenConfig
    dtype: Any = jnp.float32
    param_dtype: Any = jnp.float32
    remat: bool = False
    attn_chunk: int = 1024
    mlp_chunk: int = 0
    scan_unroll: int = 1
    attention: str = "xla"
    scan_layers: bool = True

    def setup(self) -> None:
        """Creates the embedding, the scanned layer stack, the final norm and the LM head."""
        cfg = self.cfg
        self.embed_tokens = nn.Embed(
            cfg.vocab_size,
            cfg.hidden_size,
            dtype=self.dtype,
            param_dtype=self.param_dtype,
            embedding_init=nn.initializers.normal(0.02),
        )
        layer = nn.remat(DecoderLayer, prevent_cse=False) if self.remat else DecoderLayer
        settings = (cfg, self.dtype, self.param_dtype, self.attn_chunk, self.mlp_chunk)
        if self.scan_layers:
            self.layers = nn.scan(
                layer,
                variable_axes={"params": 0},
                split_rngs={"params": True},
                in_axes=(0, nn.broadcast),
                length=cfg.num_layers,
                unroll=self.scan_unroll,
            )(*settings, self.attention)
        else:
            self.layer_list = [layer(*settings, self.attention) for _ in range(cfg.num_layers)]
        self.norm = RMSNorm(cfg.rms_norm_eps, self.dtype, self.param_dtype)
        if not cfg.tie_word_embeddings:
            self.lm_head = self.param(
                "lm_head",
                nn.initializers.normal(0.02),
                (cfg.hidden_size, cfg.vocab_size),
                self.param_dtype,
            )

    def __call__(
        self,
        input_ids: jax.Array,
        positions: jax.Array,
        mask: jax.Array,
        cache: Cache | None = None,
    ) -> tuple[jax.Array, Cache | None]:
        """Runs the trunk. Returns (hidden [B,T,E] after the final norm, updated cache or None)."""
        t = input_ids.shape[1]
        cos, sin = rope_tables(positions, self.cfg)
        mask = mask.astype(bool)
        if cache is None:
            ctx = {"cos": cos, "sin": sin, "key_mask": mask}
            kv_cache = layers = None
        else:
            index = cache["index"]
            ctx = {"cos": cos, "sin": sin, **cached_visibility(cache["mask"], index, mask)}
            kv_cache, layers = (cache["k"], cache["v"]), jnp.arange(self.cfg.num_layers)
        x = constrain(self.embed_tokens(input_ids), "batch", None, None)
        (x, kv_cache), _ = self._run_layers((x, kv_cache), layers, ctx)
        new_cache = None
        if cache is not None:
            advance = t if index.ndim == 0 else jnp.sum(mask, axis=1, dtype=jnp.int32)
            new_cache = {
                "k": kv_cache[0],
                "v": kv_cache[1],
                "mask": write_cache(cache["mask"], mask, index, *CACHE_AXES["mask"]),
                "index": index + advance,
            }
        return self.norm(x), new_cache

    def _run_layers(self, carry: tuple, inputs: Any, ctx: dict) -> tuple[tuple, Any]:
        """The layers over carry, layer l taking inputs' entry l (leading axis; None: none);
        returns (the last carry, the layers' outputs stacked)."""
        if self.scan_layers:
            return self.layers(carry, inputs, ctx)
        outputs = []
        for i, layer in enumerate(self.layer_list):
            carry, out = layer(carry, jax.tree.map(lambda a, i=i: a[i], inputs), ctx)
            outputs.append(out)
        return carry, jax.tree.map(lambda *a: jnp.stack(a), *outputs)

    def _after_prompt(
        self, input_ids: jax.Array, positions: jax.Array, mask: jax.Array, prompt: SharedPrompt
    ) -> jax.Array:
        """Final hidden states [B, T, E] of rows that continue their group's shared prompt."""
        ids, prompt_positions, prompt_mask = prompt
        rows_per_prompt = input_ids.shape[0] // ids.shape[0]
        cos, sin = rope_tables(prompt_positions, self.cfg)
        ctx = {"cos": cos, "sin": sin, "key_mask": prompt_mask.astype(bool), "return_kv": ()}
        _, (k, v) = self._run_layers((self.embed_tokens(ids), None), None, ctx)
        k, v = (jnp.repeat(a, rows_per_prompt, axis=1) for a in (k, v))  # [L, B, P, KVH, D]
        cos, sin = rope_tables(positions, self.cfg)
        ctx = {
            "cos": cos,
            "sin": sin,
            "key_mask": mask.astype(bool),
            "prefix_mask": jnp.repeat(prompt_mask.astype(bool), rows_per_prompt, axis=0),
        }
        (x, _), _ = self._run_layers((self.embed_tokens(input_ids), None), (k, v), ctx)
        return self.norm(x)


def init_cache(
    cfg: QwenConfig, batch: int, length: int, dtype: Any = jnp.float32, per_row: bool = False
) -> Cache:
    """An empty KV cache for `batch` rows and `length` slots (nothing valid, index 0).

    per_row: give every row its own write pointer (`index` int32 [B]; see the module docstring).
    """
    shape = (cfg.num_layers, batch, cfg.num_kv_heads, length, cfg.head_dim)
    return {
        "k": jnp.zeros(shape, dtype),
        "v": jnp.zeros(shape, dtype),
        "mask": jnp.zeros((batch, length), bool),
        "index": jnp.zeros((batch,) if per_row else (), jnp.int32),
    }


def unstack_layers(params: Any) -> Any:
    """Parameters of a `DenseDecoder(scan_layers=False)`: the stacked `layers` entry split into
    `layer_list_0`, `layer_list_1`, ... (one copy of the layer weights); the rest as it is."""
    stacked = params["layers"]
    count = jax.tree.leaves(stacked)[0].shape[0]
    split = {f"layer_list_{i}": jax.tree.map(lambda a, i=i: a[i], stacked) for i in range(count)}
    return {**{k: v for k, v in params.items() if k != "layers"}, **split}
