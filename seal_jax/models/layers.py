"""Building blocks shared by the decoder families (`qwen_llama`, `qwen35`): RMSNorm, RoPE,
grouped-query attention (cached, causal, Pallas splash), KV-cache writes, the SwiGLU feed-forward,
and the output head with its chunked log-probabilities (`CausalLMHead`).

KV cache layout (`qwen_llama.init_cache`): `{"k", "v": [L, B, KVH, S, D], "mask": [B, S] bool,
"index": int32 scalar or [B]}`. Heads come before slots so that one row's keys of one head are
contiguous: decode attention is then a batched matrix product over (row, head), and a decode step
on CPU takes ~0.55x the time it took with slots before heads (benchmarks/README.md, "KV cache
layout").
"""

from __future__ import annotations

import functools
import math
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as splash
from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as splash_mask
from jax.sharding import PartitionSpec as P

from seal_jax.models.config import Llama3RopeScaling, QwenConfig
from seal_jax.sharding import constrain, logical_spec, on_mesh

Params = Any
Cache = dict[str, jax.Array]
# (ids, positions, mask) [G, P] of prompts shared by groups of rows: row b continues prompt
# b // (B / G), and its positions go on from where the prompt ends.
SharedPrompt = tuple[jax.Array, jax.Array, jax.Array]


class RMSNorm(nn.Module):
    """RMS normalisation in float32, scaled by a learned weight (as Hugging Face Qwen)."""

    eps: float
    dtype: Any
    param_dtype: Any

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        """Normalises the last axis of x and returns it in the compute dtype."""
        weight = self.param("scale", nn.initializers.ones, (x.shape[-1],), self.param_dtype)
        x32 = x.astype(jnp.float32)
        y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
        return weight.astype(self.dtype) * y.astype(self.dtype)


def rope_frequencies(cfg: QwenConfig) -> jax.Array:
    """The RoPE inverse frequencies [head_dim / 2] (float32): the default ones, rescaled as
    Llama 3.1 does when the config has llama3 rope scaling."""
    d = cfg.head_dim
    inv_freq = 1.0 / (cfg.rope_theta ** (jnp.arange(0, d, 2, dtype=jnp.float32) / d))
    if cfg.rope_scaling is None:
        return inv_freq
    return llama3_frequencies(inv_freq, cfg.rope_scaling)


def llama3_frequencies(inv_freq: jax.Array, scaling: Llama3RopeScaling) -> jax.Array:
    """Llama 3.1's rescaling of default inverse frequencies, in transformers' float32 operations
    and order: long wavelengths slowed down by `factor`, short ones kept, the band between
    interpolated."""
    old_context = scaling.original_max_position_embeddings
    low_freq_wavelen = old_context / scaling.low_freq_factor
    high_freq_wavelen = old_context / scaling.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = jnp.where(wavelen > low_freq_wavelen, inv_freq / scaling.factor, inv_freq)
    smooth = (old_context / wavelen - scaling.low_freq_factor) / (
        scaling.high_freq_factor - scaling.low_freq_factor
    )
    smoothed = (1 - smooth) * scaled / scaling.factor + smooth * scaled
    medium = ~(wavelen < high_freq_wavelen) & ~(wavelen > low_freq_wavelen)
    return jnp.where(medium, smoothed, scaled)


def rope_tables(positions: jax.Array, cfg: QwenConfig) -> tuple[jax.Array, jax.Array]:
    """cos/sin tables [B, T, head_dim] (float32) for integer positions [B, T]."""
    freqs = positions.astype(jnp.float32)[..., None] * rope_frequencies(cfg)
    emb = jnp.concatenate([freqs, freqs], axis=-1)
    return jnp.cos(emb), jnp.sin(emb)


def apply_rope(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """Rotates x [B, T, H, D] by the tables (rotate-half convention of Hugging Face)."""
    x1, x2 = jnp.split(x, 2, axis=-1)
    rotated = jnp.concatenate([-x2, x1], axis=-1)
    cos, sin = cos[:, :, None, :].astype(x.dtype), sin[:, :, None, :].astype(x.dtype)
    return x * cos + rotated * sin


def attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    visible: jax.Array,
    extra: tuple[jax.Array, jax.Array, jax.Array] | None = None,
) -> jax.Array:
    """Grouped-query attention: q [B,T,H,D], k/v [B,S,KVH,D], visible [B,T,S] -> [B,T,H,D].

    extra: a second (k, v, visible) block softmaxed jointly with the first (a shared prompt's
    keys before the sequence's own), so neither is copied to splice them together.
    """
    b, t, h, d = q.shape
    kvh = k.shape[2]
    q = q.reshape(b, t, kvh, h // kvh, d)
    blocks = [(k, v, visible)] + ([extra] if extra is not None else [])
    scores = []
    for k_i, _, visible_i in blocks:
        s_i = jnp.einsum("btkgd,bskd->bkgts", q, k_i, preferred_element_type=jnp.float32)
        # A finite minimum (not -inf) keeps fully masked padding rows finite; output unused.
        scores.append(
            jnp.where(visible_i[:, None, None], s_i * (d**-0.5), jnp.finfo(jnp.float32).min)
        )
    probs = jax.nn.softmax(jnp.concatenate(scores, axis=-1), axis=-1).astype(v.dtype)
    out, start = 0, 0
    for k_i, v_i, _ in blocks:
        p_i = probs[..., start : start + k_i.shape[1]]
        out = out + jnp.einsum("bkgts,bskd->btkgd", p_i, v_i)
        start += k_i.shape[1]
    return out.reshape(b, t, h, d)


# Queries per block on sequences of at most `attn_chunk` tokens: each block reads only the keys
# up to its last query, so causal attention does less work than full [T, T] scores (CPU figures
# in benchmarks/README.md). 256 rather than 128: about as fast per step at 384-1024 tokens, and each
# block is another op for XLA, so a training program compiles 1.3-1.8x faster.
CAUSAL_BLOCK = 256


def causal_attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    key_mask: jax.Array,
    chunk: int,
    prefix: tuple[jax.Array, jax.Array, jax.Array] | None = None,
) -> jax.Array:
    """Causal GQA over a whole sequence (no cache): q [B,T,H,D], k/v [B,T,KVH,D] -> [B,T,H,D].

    Up to `chunk` tokens, queries go in static blocks of CAUSAL_BLOCK that skip the keys after
    their last query. Longer sequences are processed `chunk` queries at a time, each chunk
    rematerialised in the backward pass, so the scores held at once are [B, H, chunk, T] instead
    of [B, H, T, T] (16k-token episodes).
    key_mask [B, T] marks real tokens. prefix: (k, v [B,P,KVH,D], mask [B,P]) of tokens that come
    before the sequence (a shared prompt), visible to every query where the mask is True.
    """
    t = q.shape[1]
    key_slot = jnp.arange(t)

    def block(q_c: jax.Array, q_slot: jax.Array, end: int) -> jax.Array:
        """Queries q_c at slots q_slot, which see no key at or after slot `end`."""
        visible = (key_slot[None, :end] <= q_slot[:, None])[None] & key_mask[:, None, :end]
        k_c, v_c = k[:, :end], v[:, :end]
        if prefix is None:
            return attention(q_c, k_c, v_c, visible)
        k_p, v_p, mask_p = prefix
        visible_p = jnp.broadcast_to(mask_p[:, None, :], (*visible.shape[:2], mask_p.shape[1]))
        return attention(q_c, k_p, v_p, visible_p, extra=(k_c, v_c, visible))

    if t <= chunk:
        starts = range(0, t, CAUSAL_BLOCK)
        ends = [min(s + CAUSAL_BLOCK, t) for s in starts]
        blocks = [block(q[:, s:e], key_slot[s:e], e) for s, e in zip(starts, ends)]
        return jnp.concatenate(blocks, axis=1)
    n = -(-t // chunk)
    pad = n * chunk - t
    q_chunks = jnp.pad(q, ((0, 0), (0, pad), (0, 0), (0, 0)))
    q_chunks = q_chunks.reshape(q.shape[0], n, chunk, *q.shape[2:]).swapaxes(0, 1)
    slots = jnp.arange(n * chunk).reshape(n, chunk)
    out = jax.lax.map(jax.checkpoint(lambda a: block(*a, t)), (q_chunks, slots))
    return out.swapaxes(0, 1).reshape(q.shape[0], n * chunk, *q.shape[2:])[:, :t]


# Attention of uncached passes (`Qwen.attention`): XLA's (`causal_attention`), the Pallas splash
# kernel compiled for TPU (`splash_causal_attention`), or the same kernel in Pallas' interpreter
# (any backend; tests).
ATTENTION_KERNELS = ("xla", "splash", "splash_interpret")
# Query and key positions per splash-kernel block when the sequence is a multiple of it (else 128).
SPLASH_BLOCK = 512


def splash_causal_attention(
    q: jax.Array, k: jax.Array, v: jax.Array, key_mask: jax.Array, interpret: bool = False
) -> jax.Array:
    """Causal GQA over a whole sequence with the Pallas splash-attention kernel (TPU): the
    contract of `causal_attention` without a prefix. Blocks above the diagonal are skipped, so a
    16k-token pass does half the work of full scores, and no [T, T] scores exist in memory.
    Padding is a segment of its own (key_mask), so real queries see only real keys.

    On a mesh the kernel runs per shard (`jax.shard_map`): rows over the batch axes, heads over
    `tensor` when both the query and key heads split. interpret: run the kernel in Pallas'
    interpreter (any backend).
    """

    def local(q: jax.Array, k: jax.Array, v: jax.Array, key_mask: jax.Array) -> jax.Array:
        return _splash_local(q, k, v, key_mask, interpret)

    if not on_mesh():
        return local(q, k, v, key_mask)
    q_spec = logical_spec(q.shape, "batch", None, "heads", None)
    kv_spec = logical_spec(k.shape, "batch", None, "heads", None)
    if q_spec != kv_spec:  # the key heads do not split: keep every query head with its keys
        q_spec = kv_spec = P(kv_spec[0], None, None, None)
    mask_spec = logical_spec(key_mask.shape, "batch", None)
    # check_vma off: the kernel's pallas_call does not declare how its outputs vary over the mesh.
    specs = {"in_specs": (q_spec, kv_spec, kv_spec, mask_spec), "out_specs": q_spec}
    return jax.shard_map(local, **specs, check_vma=False)(q, k, v, key_mask)


def _splash_local(
    q: jax.Array, k: jax.Array, v: jax.Array, key_mask: jax.Array, interpret: bool
) -> jax.Array:
    """splash_causal_attention on one device: q [B,T,H,D], k/v [B,T,KVH,D] -> [B,T,H,D]."""
    b, t, h, d = q.shape
    pad = -t % 128  # the kernel's smallest block
    if pad:
        q, k, v = (jnp.pad(x, ((0, 0), (0, pad), (0, 0), (0, 0))) for x in (q, k, v))
        key_mask = jnp.pad(key_mask, ((0, 0), (0, pad)))
    length = t + pad
    block = SPLASH_BLOCK if length % SPLASH_BLOCK == 0 else 128
    sizes = splash.BlockSizes(
        block_q=block,
        block_kv=block,
        block_q_dkv=block,
        block_kv_dkv=block,
        block_q_dq=block,
        block_kv_dq=block,
    )
    mask = splash_mask.MultiHeadMask([splash_mask.CausalMask((length, length))] * h)
    kernel = splash.make_splash_mha(
        mask=mask, block_sizes=sizes, head_shards=1, q_seq_shards=1, interpret=interpret
    )
    segments = key_mask.astype(jnp.int32)
    ids = splash.SegmentIds(q=segments, kv=segments)

    def heads_first(x: jax.Array) -> jax.Array:
        return x.transpose(0, 2, 1, 3)

    out = jax.vmap(kernel)(heads_first(q * d**-0.5), heads_first(k), heads_first(v), ids)
    return heads_first(out)[:, :t]


# (batch axis, slot axis) of each cache entry (`init_cache`); index has no slot axis.
CACHE_AXES = {"k": (1, 3), "v": (1, 3), "mask": (0, 1), "index": (0, None)}


def write_cache(
    buf: jax.Array, new: jax.Array, index: jax.Array, batch_axis: int, slot_axis: int
) -> jax.Array:
    """Writes new into buf at slot `index` (scalar) or `index[b]` per row.

    buf has its batch (B) at `batch_axis` and its slots (S) at `slot_axis`; new has T slots in
    place of S. Per-row writes that fall past the end of the buffer are dropped (only padding
    can be there). The write is a scatter into buf, in place when buf is donated.
    """
    if index.ndim == 0:
        start = [0] * buf.ndim
        start[slot_axis] = index
        return jax.lax.dynamic_update_slice(buf, new, tuple(start))
    rows = jnp.arange(buf.shape[batch_axis])[:, None]
    slots = index[:, None] + jnp.arange(new.shape[slot_axis])
    where = [slice(None)] * buf.ndim
    where[batch_axis], where[slot_axis] = rows, slots
    # Advanced indices [B, T] come first in the indexed shape (they are not adjacent in buf).
    rest = [a for a in range(new.ndim) if a not in (batch_axis, slot_axis)]
    new = new.transpose(batch_axis, slot_axis, *rest) if batch_axis + 1 != slot_axis else new
    return buf.at[tuple(where)].set(new, mode="drop")


def write_layer_cache(
    buf: jax.Array, new: jax.Array, layer: jax.Array, index: jax.Array
) -> jax.Array:
    """Writes one layer's new keys (or values) new [B, KVH, T, D] into the whole cache buffer
    buf [L, B, KVH, S, D] at layer `layer` (int32 scalar), as `write_cache` writes slots: at
    `index` (scalar) or `index[b]` per row, per-row writes past the end dropped."""
    if index.ndim == 0:
        return jax.lax.dynamic_update_slice(buf, new[None], (layer, 0, 0, index, 0))
    b, kvh, t, _ = new.shape
    # An index per (row, head, slot): each write is one contiguous [D] vector, so the compiler
    # keeps the cache's layout (for (KVH, D) windows TPU's put slots first, copying the cache).
    rows, heads = jnp.arange(b)[:, None, None], jnp.arange(kvh)[None, :, None]
    slots = (index[:, None] + jnp.arange(t))[:, None, :]
    return buf.at[layer, rows, heads, slots].set(new, mode="drop")


# Cache slots per block of cached attention (`live_attention`): a call reads the blocks up to its
# rows' furthest query and no further, so its cost follows the live lengths, not the cache's size.
KEY_BLOCK = 512
# On CPU a block is a copy out of the cache (XLA's CPU dots do not read a dynamic slice in place):
# a decode step's block costs about 3-4x reading it in place. A decode step whose live blocks
# cover more than 1/CPU_WHOLE_CACHE_SHARE of the cache reads the whole cache instead (whose
# size the engine's buckets keep within 1.5x of the rows' needs).
CPU_WHOLE_CACHE_SHARE = 4


def cached_visibility(cache_mask: jax.Array, index: jax.Array, mask: jax.Array) -> dict:
    """What a cached call's queries may see: ctx entries "cached_mask" [B, S] (the real tokens
    of the cache as this call leaves it: earlier slots before the write pointer, then the call's
    own T tokens at `index`; slots from the pointer on that this call does not write are stale)
    and "query_slot" [B, T] (each query's slot: a query sees slots up to its own). index: the
    write pointer, scalar or [B]; mask [B, T]: the call's real tokens."""
    slot = jnp.arange(cache_mask.shape[1])
    earlier = cache_mask & (slot < index[..., None])
    batch_axis, slot_axis = CACHE_AXES["mask"]
    cached_mask = write_cache(earlier, mask, index, batch_axis, slot_axis)
    query_slot = jnp.broadcast_to(index[..., None] + jnp.arange(mask.shape[1]), mask.shape)
    return {"cached_mask": cached_mask, "query_slot": query_slot, "index": index}


def live_attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    key_mask: jax.Array,
    query_slot: jax.Array,
    layer: jax.Array | int,
) -> jax.Array:
    """Grouped-query attention of q [B,T,H,D] to the slots s of layer `layer` of the caches
    k/v [L,B,KVH,S,D] (heads first) with key_mask[b, s] and s <= query_slot[b, t]; returns
    [B,T,H,D]. Blocks are read from the stacked caches directly: a layer's slice taken first
    was a copy of it in the TPU decode loop's temporaries.

    Online softmax over blocks of KEY_BLOCK slots in a loop that stops after the block holding
    the largest query slot: a call costs the live length of its longest row, whatever S is (a
    decode step at 3,000 tokens in a 12,288-slot cache reads 3,072 slots). A block is one
    batched matrix product over (row, key head) with the query heads and tokens as its rows.
    On CPU, see CPU_WHOLE_CACHE_SHARE.
    """
    t, slots = q.shape[1], k.shape[-2]
    block = min(KEY_BLOCK, slots)
    looped = functools.partial(_online_softmax, block=block)
    if t > 1 or block == slots:
        return looped(q, k, v, key_mask, query_slot, layer)
    whole = functools.partial(_online_softmax, block=slots)

    def cpu(*args: jax.Array) -> jax.Array:
        live_slots = (jnp.max(query_slot) // block + 1) * block
        return jax.lax.cond(live_slots * CPU_WHOLE_CACHE_SHARE <= slots, looped, whole, *args)

    args = (q, k, v, key_mask, query_slot, layer)
    return jax.lax.platform_dependent(*args, cpu=cpu, default=looped)


def _online_softmax(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    key_mask: jax.Array,
    query_slot: jax.Array,
    layer: jax.Array | int,
    *,
    block: int,
) -> jax.Array:
    """`live_attention` in blocks of `block` slots, up to the one holding the furthest query."""
    b, t, h, d = q.shape
    kvh, slots = k.shape[2], k.shape[3]
    g = h // kvh
    q = q.reshape(b, t, kvh, g, d).transpose(0, 2, 3, 1, 4).reshape(b, kvh, g * t, d)
    lowest = jnp.finfo(jnp.float32).min

    def step(j: jax.Array, carry: tuple) -> tuple:
        top, total, acc = carry  # running max [B,KVH,G,T], sum of exp, weighted values
        # The last block may start early to stay inside the cache; slots before j * block were
        # counted by the previous block, so they are masked here.
        start = jnp.minimum(j * block, slots - block)
        at, size = (layer, 0, 0, start, 0), (1, b, kvh, block, d)
        k_j, v_j = (jax.lax.dynamic_slice(x, at, size)[0] for x in (k, v))
        slot = start + jnp.arange(block)
        seen = jax.lax.dynamic_slice_in_dim(key_mask, start, block, axis=1) & (slot >= j * block)
        visible = seen[:, None, :] & (slot <= query_slot[..., None])  # [B, T, block]
        scores = jnp.einsum("bkmd,bknd->bkmn", q, k_j, preferred_element_type=jnp.float32)
        scores = scores.reshape(b, kvh, g, t, block) * (d**-0.5)
        scores = jnp.where(visible[:, None, None], scores, lowest)
        new_top = jnp.maximum(top, jnp.max(scores, axis=-1))
        probs = jnp.exp(scores - new_top[..., None])
        scale = jnp.exp(top - new_top)
        total = total * scale + jnp.sum(probs, axis=-1)
        probs = probs.reshape(b, kvh, g * t, block).astype(v.dtype)
        pv = jnp.einsum("bkmn,bknd->bkmd", probs, v_j, preferred_element_type=jnp.float32)
        acc = acc * scale.reshape(b, kvh, g * t, 1) + pv
        return new_top, total, acc

    init = (
        jnp.full((b, kvh, g, t), lowest, jnp.float32),
        jnp.zeros((b, kvh, g, t), jnp.float32),
        jnp.zeros((b, kvh, g * t, d), jnp.float32),
    )
    blocks = jnp.max(query_slot) // block + 1
    _, total, acc = jax.lax.fori_loop(0, blocks, step, init)
    out = acc / total.reshape(b, kvh, g * t, 1)
    out = out.reshape(b, kvh, g, t, d).transpose(0, 3, 1, 2, 4)
    return out.reshape(b, t, h, d).astype(q.dtype)


def cached_attention(
    q: jax.Array, k: jax.Array, v: jax.Array, cache: tuple, layer: jax.Array, ctx: dict
) -> tuple[jax.Array, tuple[jax.Array, jax.Array]]:
    """One layer's attention on a cached call: the call's keys k/v [B,T,KVH,D] are written into
    the whole cache (k, v) [L,B,KVH,S,D] at layer `layer` and slots ctx "index", then q [B,T,H,D]
    attends to the layer's slots as ctx says (`cached_visibility`, `live_attention`). Returns
    (output [B,T,H,D], the cache)."""
    k, v = k.swapaxes(1, 2), v.swapaxes(1, 2)  # the cache's layout
    cache = tuple(write_layer_cache(c, n, layer, ctx["index"]) for c, n in zip(cache, (k, v)))
    # Read after the write, from the carried buffers: XLA's CPU compiler copied the whole cache
    # to read it before an in-place write.
    out = live_attention(q, *cache, ctx["cached_mask"], ctx["query_slot"], layer)
    return out, cache


def dense(features: int, name: str, dtype: Any, param_dtype: Any, bias: bool = False) -> nn.Dense:
    """A bias-free (unless `bias`) `nn.Dense` named as Hugging Face names the projection."""
    return nn.Dense(features, use_bias=bias, dtype=dtype, param_dtype=param_dtype, name=name)


class Kernel(nn.Module):
    """A dense layer's weight alone, named and initialised as `nn.Dense`'s `kernel`, for layers
    that apply it themselves (`Mlp`'s sequence chunks)."""

    shape: tuple[int, int]
    param_dtype: Any

    @nn.compact
    def __call__(self) -> jax.Array:
        """The [in, out] weight."""
        return self.param("kernel", nn.initializers.lecun_normal(), self.shape, self.param_dtype)


class Mlp(nn.Module):
    """SwiGLU feed-forward: down(silu(gate(x)) * up(x)).

    chunk: when positive and shorter than the sequence, the sequence goes through in chunks of
    `chunk` positions, each rematerialised in the backward pass, so the [T, intermediate] blocks
    exist for one chunk at a time (16k-token training rows; the feed-forward is position-wise,
    so the result is the same).
    """

    cfg: QwenConfig
    dtype: Any
    param_dtype: Any
    chunk: int = 0

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        """x [B,T,E] -> [B,T,E]."""
        e, f, dt, pdt = (
            self.cfg.hidden_size,
            self.cfg.intermediate_size,
            self.dtype,
            self.param_dtype,
        )
        gate_w = Kernel((e, f), pdt, name="gate_proj")().astype(dt)
        up_w = Kernel((e, f), pdt, name="up_proj")().astype(dt)
        down_w = Kernel((f, e), pdt, name="down_proj")().astype(dt)

        def feed_forward(x: jax.Array) -> jax.Array:
            gate = constrain(jnp.einsum("bte,ef->btf", x, gate_w), "batch", None, "mlp")
            up = constrain(jnp.einsum("bte,ef->btf", x, up_w), "batch", None, "mlp")
            return jnp.einsum("btf,fe->bte", nn.silu(gate) * up, down_w)

        x = x.astype(dt)
        b, t, _ = x.shape
        if not 0 < self.chunk < t or t % self.chunk:
            return feed_forward(x)
        chunks = x.reshape(b, t // self.chunk, self.chunk, e).swapaxes(0, 1)
        out = jax.lax.map(jax.checkpoint(feed_forward), chunks)
        return out.swapaxes(0, 1).reshape(b, t, e)


class CausalLMHead:
    """The output head both decoder families share (mixed into their Flax modules): the same
    `embed_tokens` / `lm_head` / `tie_word_embeddings` fields, full logits, and log-probabilities
    of given targets that never build [B, T, V] logits. The module supplies `__call__` (the trunk)
    and `_after_prompt` (the trunk for rows that continue a shared prompt)."""

    def output_embedding(self) -> jax.Array:
        """The [E, V] matrix that maps hidden states to logits (tied or untied)."""
        if self.cfg.tie_word_embeddings:
            return self.embed_tokens.embedding.T
        return self.lm_head

    def logits(
        self,
        input_ids: jax.Array,
        positions: jax.Array,
        mask: jax.Array,
        cache: Cache | None = None,
    ) -> tuple[jax.Array, Cache | None]:
        """Full float32 logits [B, T, V] (inference and tests; training uses token_logprobs)."""
        hidden, cache = self(input_ids, positions, mask, cache)
        w = self.output_embedding().astype(self.dtype)
        return jnp.einsum("bte,ev->btv", hidden, w, preferred_element_type=jnp.float32), cache

    def token_logprobs(
        self,
        input_ids: jax.Array,
        positions: jax.Array,
        mask: jax.Array,
        targets: jax.Array,
        chunk: int,
        with_entropy: bool,
        prompt: SharedPrompt | None = None,
    ) -> tuple[jax.Array, jax.Array | None]:
        """log p(targets[b, t] | tokens <= t) [B, T] float32 (and the entropy if asked).

        prompt: tokens shared by consecutive rows that come before each row's input_ids (see
        `SharedPrompt`); they are run once per group and their keys and values reused by the
        group's rows, so the group's gradient through them is summed, as if each row had its own.
        """
        if prompt is None:
            hidden, _ = self(input_ids, positions, mask)
        else:
            hidden = self._after_prompt(input_ids, positions, mask, prompt)
        w = self.output_embedding().astype(self.dtype)
        return chunked_token_logprobs(hidden, w, targets, chunk, with_entropy)


def chunked_token_logprobs(
    hidden: jax.Array, w: jax.Array, targets: jax.Array, chunk: int, with_entropy: bool
) -> tuple[jax.Array, jax.Array | None]:
    """Log-probs (and entropies) of targets [B,T] from hidden [B,T,E] and output matrix w [E,V].

    The sequence is processed in chunks of `chunk` positions, each rematerialised in the backward
    pass, so at most a [B, chunk, V] float32 block of logits exists at any time. On a mesh the
    vocabulary is split over every chip ("vocab") and each chunk's hidden states are gathered
    over the batch: a chip computes all rows' logits for its share of the vocabulary, and the
    gradient of w stays split (no chip holds w or its float32 gradient whole; the log-sum-exp
    and the picked logit are reduced across chips).
    """
    b, t, e = hidden.shape
    chunk = min(chunk, t)
    n = -(-t // chunk)
    pad = n * chunk - t
    h = jnp.pad(hidden, ((0, 0), (0, pad), (0, 0))).reshape(b, n, chunk, e).swapaxes(0, 1)
    tg = jnp.pad(targets, ((0, 0), (0, pad))).reshape(b, n, chunk).swapaxes(0, 1)
    w = constrain(w, None, "vocab")

    @jax.checkpoint
    def one_chunk(args: tuple[jax.Array, jax.Array]) -> tuple[jax.Array, jax.Array]:
        h_c, t_c = args
        h_c = constrain(h_c, None, None, None)
        logits = jnp.einsum("bce,ev->bcv", h_c, w, preferred_element_type=jnp.float32)
        logits = constrain(logits, None, None, "vocab")
        lse = jax.nn.logsumexp(logits, axis=-1)
        if on_mesh():  # the vocabulary is split over chips: a masked sum needs only a reduction
            vocab_ids = jnp.arange(logits.shape[-1])
            picked = jnp.sum(jnp.where(vocab_ids == t_c[..., None], logits, 0.0), axis=-1)
        else:  # one device: a gather (and the CPU default's numbers stay the same)
            picked = jnp.take_along_axis(logits, t_c[..., None], axis=-1)[..., 0]
        ent = jnp.zeros_like(lse)
        if with_entropy:
            probs = jnp.exp(logits - lse[..., None])
            ent = lse - jnp.sum(probs * logits, axis=-1)
        return constrain(picked - lse, "batch", None), constrain(ent, "batch", None)

    logp, ent = jax.lax.map(one_chunk, (h, tg))
    logp = logp.swapaxes(0, 1).reshape(b, n * chunk)[:, :t]
    ent = ent.swapaxes(0, 1).reshape(b, n * chunk)[:, :t]
    return logp, (ent if with_entropy else None)
