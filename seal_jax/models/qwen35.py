"""Flax (linen) Qwen3.5 text model: Gated DeltaNet linear-attention layers and gated
full-attention layers, in the order of the config's `layer_types`.

* Full attention (`self_attn`): Qwen3's GQA with q/k RMSNorm, plus an output gate (q_proj yields,
  per head, the query and a gate; the attention output is multiplied by sigmoid(gate)) and
  partial RoPE (only the first `rotary_dim` dims of each head rotate).
* Linear attention (`linear_attn`): a causal depthwise convolution over [q | k | v] with SiLU,
  L2-normalised q and k, and the gated delta rule
      S_t = exp(g_t) S_{t-1} + k_t (beta_t (v_t - exp(g_t) S_{t-1}^T k_t))^T,   o_t = S_t^T q_t
  with g_t = -exp(A_log) softplus(a_t + dt_bias) and beta_t = sigmoid(b_t), followed by an
  RMSNorm gated by SiLU(z). Training runs the chunked parallel form (`chunked_delta_rule`, chunk
  size `cfg.linear_chunk`); single-token decoding the recurrent one (`recurrent_delta_rule`).
* RMSNorms other than the gated one scale by (1 + weight), as transformers' Qwen3_5RMSNorm.

Padding never reaches the recurrent state: padded positions have zero q, k, v, beta and decay
exp(0) = 1, so the state passes them unchanged, wherever they sit.

Shared-prompt training passes (`token_logprobs(..., prompt=...)`, as the dense decoder's): each
group's prompt runs once and yields, per layer, what its rows continue from: the full layers' keys
and values (the rows' queries attend to them where the prompt's mask is set) and the linear layers'
convolution inputs (the last K-1 real ones) and recurrent state at the end of the prompt, from
which the rows' convolution and chunked delta rule go on; so the prompt may be padded on either
side. The group's rows share these arrays, so their gradients through the prompt add up, as if each
row had its own.

Layers are scanned over repetitions of `cfg.layer_pattern` (Qwen3.5: three linear layers and one
full, scanned eight times for 32 layers); the parameters of pattern position j are
`layers/l{j}/...` with a leading repetition axis, so HF layer g * len(pattern) + j is entry g.

Cache (`init_cache`): the Qwen KV cache of the full layers (`k`, `v`: [F, B, KVH, S, D], `mask`,
`index`; see `seal_jax.models.layers`) plus, per linear layer, `conv` [N, B, K-1, C] (the last K-1
real convolution inputs) and `state` [N, B, Hv, Dk, Dv] (float32 recurrent state). Their size
does not depend on the history length. The whole cache is the layer scan's carry, each layer
reading and writing its own entries, so a donated cache is updated in place.
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from seal_jax.models.config import FULL_ATTENTION, LINEAR_ATTENTION, Qwen35Config
from seal_jax.models.layers import (
    CACHE_AXES,
    Cache,
    CausalLMHead,
    Mlp,
    SharedPrompt,
    apply_rope,
    cached_attention,
    cached_visibility,
    causal_attention,
    dense,
    splash_causal_attention,
    write_cache,
)
from seal_jax.sharding import constrain

# (batch axis, slot axis) of each cache entry; the linear layers' states have no slot axis.
CACHE_AXES_35 = {**CACHE_AXES, "conv": (1, None), "state": (1, None)}


class OffsetRMSNorm(nn.Module):
    """RMS normalisation in float32 scaled by (1 + weight) (weight initialised to zero)."""

    eps: float
    dtype: Any
    param_dtype: Any

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        """Normalises the last axis of x and returns it in the compute dtype."""
        weight = self.param("scale", nn.initializers.zeros, (x.shape[-1],), self.param_dtype)
        x32 = x.astype(jnp.float32)
        y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
        return (y * (1.0 + weight.astype(jnp.float32))).astype(self.dtype)


class GatedRMSNorm(nn.Module):
    """RMS normalisation scaled by a weight and gated by SiLU(gate), in float32."""

    eps: float
    dtype: Any
    param_dtype: Any

    @nn.compact
    def __call__(self, x: jax.Array, gate: jax.Array) -> jax.Array:
        """Normalises the last axis of x, gated by gate (same shape)."""
        weight = self.param("scale", nn.initializers.ones, (x.shape[-1],), self.param_dtype)
        x32 = x.astype(jnp.float32)
        y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
        y = weight.astype(jnp.float32) * y
        return (y * nn.silu(gate.astype(jnp.float32))).astype(self.dtype)


class Weight(nn.Module):
    """A parameter named `weight` under the module's name (a checkpoint tensor used as is)."""

    shape: tuple[int, ...]
    initializer: Any
    param_dtype: Any

    @nn.compact
    def __call__(self) -> jax.Array:
        """The parameter."""
        return self.param("weight", self.initializer, self.shape, self.param_dtype)


def rope_tables(positions: jax.Array, cfg: Qwen35Config) -> tuple[jax.Array, jax.Array]:
    """cos/sin tables [B, T, rotary_dim] (float32) for integer positions [B, T]."""
    d = cfg.rotary_dim
    inv_freq = 1.0 / (cfg.rope_theta ** (jnp.arange(0, d, 2, dtype=jnp.float32) / d))
    freqs = positions.astype(jnp.float32)[..., None] * inv_freq
    emb = jnp.concatenate([freqs, freqs], axis=-1)
    return jnp.cos(emb), jnp.sin(emb)


def apply_partial_rope(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """Rotates the first cos.shape[-1] dims of x [B, T, H, D]; the rest pass unchanged."""
    d = cos.shape[-1]
    return jnp.concatenate([apply_rope(x[..., :d], cos, sin), x[..., d:]], axis=-1)


def l2norm(x: jax.Array, eps: float = 1e-6) -> jax.Array:
    """x / sqrt(sum(x^2) + eps) over the last axis (the FLA library's form)."""
    return x * jax.lax.rsqrt(jnp.sum(x * x, axis=-1, keepdims=True) + eps)


def recurrent_delta_rule(
    q: jax.Array, k: jax.Array, v: jax.Array, g: jax.Array, beta: jax.Array, state: jax.Array
) -> tuple[jax.Array, jax.Array]:
    """The gated delta rule one token at a time (float32).

    q, k [B, T, H, Dk]; v [B, T, H, Dv]; g (log decay, <= 0), beta [B, T, H]; state
    [B, H, Dk, Dv]. Returns (outputs [B, T, H, Dv], final state).
    """

    def step(s: jax.Array, xs: tuple[jax.Array, ...]) -> tuple[jax.Array, jax.Array]:
        q_t, k_t, v_t, g_t, b_t = xs
        s = s * jnp.exp(g_t)[..., None, None]
        delta = (v_t - jnp.einsum("bhk,bhkv->bhv", k_t, s)) * b_t[..., None]
        s = s + k_t[..., :, None] * delta[..., None, :]
        return s, jnp.einsum("bhk,bhkv->bhv", q_t, s)

    time_major = [x.swapaxes(0, 1) for x in (q, k, v, g, beta)]
    state, out = jax.lax.scan(step, state, time_major)
    return out.swapaxes(0, 1), state


def chunked_delta_rule(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    g: jax.Array,
    beta: jax.Array,
    state: jax.Array,
    chunk: int,
) -> tuple[jax.Array, jax.Array]:
    """The gated delta rule in chunks of `chunk` positions (float32): the same result as
    `recurrent_delta_rule`, with matrix products inside a chunk and a scan across chunks.

    Inside a chunk the delta rule's sequential updates are solved at once (the WY / UT form: a
    unit lower-triangular system over the chunk's keys); the scan carries the state between
    chunks. The sequence is zero-padded to whole chunks (beta = g = 0: no effect on the state).
    """
    b, t = k.shape[:2]
    n = -(-t // chunk)
    pad = n * chunk - t

    def to_chunks(x: jax.Array) -> jax.Array:  # [B, T, H, ...] -> [N, B, H, C, ...]
        x = jnp.pad(x, [(0, 0), (0, pad)] + [(0, 0)] * (x.ndim - 2))
        return jnp.moveaxis(x.reshape(b, n, chunk, *x.shape[2:]), (1, 2), (0, 3))

    q, k, v, g, beta = map(to_chunks, (q, k, v, g, beta))
    cum = jnp.cumsum(g, axis=-1)  # log decay from the chunk's start through each position
    causal = jnp.tril(jnp.ones((chunk, chunk), bool))
    decay = jnp.exp(jnp.where(causal, cum[..., :, None] - cum[..., None, :], -jnp.inf))
    k_beta = k * beta[..., None]
    # Row i of the unit lower-triangular system couples token i's update to the earlier ones.
    system = jnp.einsum("...id,...jd->...ij", k_beta, k) * decay

    # The updates if the incoming state were zero, and how each update reads the incoming state.
    rhs = (v * beta[..., None], k_beta * jnp.exp(cum)[..., None])
    values, reads = jax.lax.platform_dependent(
        system, *rhs, cpu=_solve_by_inverse, default=_solve_by_substitution
    )
    intra = jnp.einsum("...id,...jd->...ij", q, k) * decay
    q_decayed = q * jnp.exp(cum)[..., None]
    k_decayed = k * jnp.exp(cum[..., -1:] - cum)[..., None]
    chunk_decay = jnp.exp(cum[..., -1])[..., None, None]

    def step(s: jax.Array, xs: tuple[jax.Array, ...]) -> tuple[jax.Array, jax.Array]:
        values_c, reads_c, q_c, k_c, intra_c, decay_c = xs
        updates = values_c - reads_c @ s
        out = q_c @ s + intra_c @ updates
        return s * decay_c + k_c.swapaxes(-1, -2) @ updates, out

    xs = (values, reads, q_decayed, k_decayed, intra, chunk_decay)
    state, out = jax.lax.scan(step, state, xs)  # out [N, B, H, C, Dv]
    out = jnp.moveaxis(out, (0, 3), (1, 2)).reshape(b, n * chunk, *out.shape[2:3], -1)
    return out[:, :t], state


def _solve_by_substitution(system: jax.Array, *rhs: jax.Array) -> tuple[jax.Array, ...]:
    """Each rhs [..., C, D] solved against the unit lower-triangular part of system [..., C, C]
    (XLA's triangular solve)."""
    return tuple(
        jax.lax.linalg.triangular_solve(system, b, left_side=True, lower=True, unit_diagonal=True)
        for b in rhs
    )


def _solve_by_inverse(system: jax.Array, *rhs: jax.Array) -> tuple[jax.Array, ...]:
    """`_solve_by_substitution` by matrix products alone, for CPUs: jaxlib's LAPACK triangular
    solve splits its batch over XLA's CPU thread pool from inside that pool and waits, so two
    solves running at once on a 2-core host deadlock it (jaxlib 0.10; a training step's backward
    pass has several).

    The inverse of the unit lower-triangular matrix is built from those of its diagonal blocks
    of 1, 2, 4, ... rows, [[A, 0], [B, D]]^-1 = [[A^-1, 0], [-D^-1 B A^-1, D^-1]]: the blocked
    inversion, log2(C) levels of two products each.
    """
    c = system.shape[-1]
    n = 1 << (c - 1).bit_length()  # padded to a power of two; the padding's inverse is I
    pad = [(0, 0)] * (system.ndim - 2) + [(0, n - c)] * 2
    strict = jnp.tril(jnp.pad(system, pad), -1)
    inverse = jnp.broadcast_to(jnp.eye(n, dtype=system.dtype), strict.shape)
    rows = jnp.arange(n)
    size = 1
    while size < n:
        # The B blocks: below the diagonal blocks of `size` rows, within those of 2 * size rows.
        pair, block = rows // (2 * size), rows // size
        below = (pair[:, None] == pair[None, :]) & (block[:, None] != block[None, :])
        inverse = inverse - inverse @ jnp.where(below, strict, 0.0) @ inverse
        size *= 2
    inverse = inverse[..., :c, :c]
    return tuple(inverse @ b for b in rhs)


def last_real(x: jax.Array, mask: jax.Array, n: int) -> jax.Array:
    """The last n entries of x [B, S, C] whose mask [B, S] is set, oldest first ([B, n, C])."""
    rank = jnp.cumsum(mask, axis=1, dtype=jnp.int32)
    slot = rank - (rank[:, -1:] - n) - 1  # where each real entry lands among the last n
    pick = mask[..., None] & (slot[..., None] == jnp.arange(n))
    # A one-hot sum: exactly the picked values (each output is one product by 1).
    return jnp.einsum("bsn,bsc->bnc", pick.astype(x.dtype), x)


class GatedDeltaNet(nn.Module):
    """Qwen3.5's linear attention; see the module docstring."""

    cfg: Qwen35Config
    dtype: Any
    param_dtype: Any

    @nn.compact
    def __call__(
        self, x: jax.Array, layer_state: Any, ctx: dict
    ) -> tuple[jax.Array, tuple[jax.Array, jax.Array] | None]:
        """x [B,T,E] -> (output [B,T,E], new (conv, state) when layer_state (conv, state) is
        given, else None)."""
        cfg, dt, pdt = self.cfg, self.dtype, self.param_dtype
        b, t, _ = x.shape
        hk, hv = cfg.linear_num_key_heads, cfg.linear_num_value_heads
        dk, dv = cfg.linear_key_head_dim, cfg.linear_value_head_dim
        mask = ctx["key_mask"]
        x = jnp.where(mask[..., None], x, 0).astype(dt)  # padding enters as zeros (as HF)
        qkv = dense(cfg.conv_dim, "in_proj_qkv", dt, pdt)(x)
        z = dense(hv * dv, "in_proj_z", dt, pdt)(x).reshape(b, t, hv, dv)
        beta = nn.sigmoid(dense(hv, "in_proj_b", dt, pdt)(x).astype(jnp.float32))
        a = dense(hv, "in_proj_a", dt, pdt)(x).astype(jnp.float32)
        a_log = self.param("A_log", _a_log_init, (hv,), pdt)
        dt_bias = self.param("dt_bias", nn.initializers.ones, (hv,), pdt)
        g = -jnp.exp(a_log.astype(jnp.float32)) * jax.nn.softplus(a + dt_bias.astype(jnp.float32))
        # Padding: no decay and no update, so the recurrent state passes it unchanged.
        beta, g = jnp.where(mask[..., None], beta, 0.0), jnp.where(mask[..., None], g, 0.0)

        k_conv = cfg.conv_kernel
        init = nn.initializers.normal(k_conv**-0.5)
        conv_w = Weight((cfg.conv_dim, 1, k_conv), init, pdt, name="conv1d")()[:, 0, :]
        conv_in = layer_state[0].astype(dt) if layer_state is not None else None
        if conv_in is None:
            conv_in = jnp.zeros((b, k_conv - 1, cfg.conv_dim), dt)
        joined = jnp.concatenate([conv_in, qkv], axis=1)  # [B, K-1+T, C]
        conv = sum(
            joined[:, i : i + t].astype(jnp.float32) * conv_w[:, i].astype(jnp.float32)
            for i in range(k_conv)
        )
        conv = nn.silu(conv)  # stays float32: the delta rule runs in float32 (as transformers')
        conv = jnp.where(mask[..., None], conv, 0.0)
        key_dim = hk * dk
        q = l2norm(conv[..., :key_dim].reshape(b, t, hk, dk)) * dk**-0.5
        k = l2norm(conv[..., key_dim : 2 * key_dim].reshape(b, t, hk, dk))
        v = conv[..., 2 * key_dim :].reshape(b, t, hv, dv)
        # Each query/key head serves hv / hk consecutive value heads.
        q, k = (jnp.repeat(y, hv // hk, axis=2) for y in (q, k))

        state = jnp.zeros((b, hv, dk, dv), jnp.float32) if layer_state is None else layer_state[1]
        if layer_state is not None and t == 1:
            out, state = recurrent_delta_rule(q, k, v, g, beta, state)
        else:
            out, state = chunked_delta_rule(q, k, v, g, beta, state, cfg.linear_chunk)
        # The float32 output goes into the norm (which is float32) without a rounding.
        out = GatedRMSNorm(cfg.rms_norm_eps, dt, pdt, name="norm")(out, z)
        out = dense(cfg.hidden_size, "out_proj", dt, pdt)(out.reshape(b, t, hv * dv))
        if layer_state is None:
            return out, None
        joined_mask = jnp.concatenate([jnp.ones((b, k_conv - 1), bool), mask], axis=1)
        return out, (last_real(joined, joined_mask, k_conv - 1), state)


def _a_log_init(key: jax.Array, shape: tuple[int, ...], dtype: Any) -> jax.Array:
    """log(A) with A uniform in [0.01, 16] (transformers' initialisation)."""
    return jnp.log(jax.random.uniform(key, shape, jnp.float32, 0.01, 16.0)).astype(dtype)


class GatedAttention(nn.Module):
    """Qwen3.5's full attention: GQA with q/k norms, partial RoPE and a sigmoid output gate."""

    cfg: Qwen35Config
    dtype: Any
    param_dtype: Any
    attn_chunk: int = 1024
    attention: str = "xla"

    @nn.compact
    def __call__(
        self, x: jax.Array, layer_cache: Any, ctx: dict, prefix: Any = None
    ) -> tuple[jax.Array, Any, Any]:
        """x [B,T,E] -> (output [B,T,E], the cache or None, this call's (k, v) or None).

        layer_cache: None, or (the whole (k, v) cache of the full layers, this layer's index in
        it): the call's keys and values are written there (`layers.cached_attention`).
        prefix: a shared prompt's (k, v) [B,P,KVH,D], attended to where ctx "prefix_mask" [B,P]
        is set. The call's (k, v) come back when ctx has "return_state" (a prompt pass).
        """
        cfg, dt, pdt = self.cfg, self.dtype, self.param_dtype
        b, t, _ = x.shape
        h, kvh, hd = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        q_gate = dense(h * 2 * hd, "q_proj", dt, pdt)(x).reshape(b, t, h, 2 * hd)
        q, gate = q_gate[..., :hd], q_gate[..., hd:]
        k = dense(kvh * hd, "k_proj", dt, pdt)(x).reshape(b, t, kvh, hd)
        v = dense(kvh * hd, "v_proj", dt, pdt)(x).reshape(b, t, kvh, hd)
        q = constrain(q, "batch", None, "heads", None)
        k = constrain(k, "batch", None, "heads", None)
        v = constrain(v, "batch", None, "heads", None)
        q = apply_partial_rope(
            OffsetRMSNorm(cfg.rms_norm_eps, dt, pdt, name="q_norm")(q), *ctx["rope"]
        )
        k = apply_partial_rope(
            OffsetRMSNorm(cfg.rms_norm_eps, dt, pdt, name="k_norm")(k), *ctx["rope"]
        )
        new_cache = None
        kv = (k, v) if "return_state" in ctx else None
        if prefix is not None:  # training on a shared prompt
            prefix = (*prefix, ctx["prefix_mask"])
            out = causal_attention(q, k, v, ctx["key_mask"], self.attn_chunk, prefix)
        elif layer_cache is not None:
            out, new_cache = cached_attention(q, k.astype(dt), v.astype(dt), *layer_cache, ctx)
        elif self.attention == "xla":
            out = causal_attention(q, k, v, ctx["key_mask"], self.attn_chunk)
        else:
            interpret = self.attention == "splash_interpret"
            out = splash_causal_attention(q, k, v, ctx["key_mask"], interpret)
        out = constrain(out, "batch", None, "heads", None).reshape(b, t, h * hd)
        out = out * nn.sigmoid(gate.reshape(b, t, h * hd))
        return dense(cfg.hidden_size, "o_proj", dt, pdt)(out), new_cache, kv


class Qwen35Layer(nn.Module):
    """One pre-norm decoder block of either kind (`kind`: an entry of layer_types)."""

    cfg: Qwen35Config
    kind: str
    dtype: Any
    param_dtype: Any
    attn_chunk: int = 1024
    mlp_chunk: int = 0
    attention: str = "xla"

    @nn.compact
    def __call__(
        self,
        x: jax.Array,
        cache: Cache | None,
        index: jax.Array | None,
        ctx: dict,
        prompt_state: Any = None,
    ) -> tuple[jax.Array, Cache | None, Any]:
        """x [B,T,E] -> (x', the cache with this layer's entries updated or None, this layer's
        state at the end of a prompt pass or None).

        cache: None, or the whole {"k", "v", "conv", "state"} cache; index: this layer's entry
        in the cache arrays of its kind. prompt_state: the state of a shared prompt that the rows
        continue (ctx has "prefix_mask"): (k, v) of a full layer, (conv, state) of a linear one.
        With ctx "return_state" (a prompt pass) the layer returns that state.
        """
        cfg, dt, pdt = self.cfg, self.dtype, self.param_dtype
        x = constrain(x, "batch", None, None)
        h = OffsetRMSNorm(cfg.rms_norm_eps, dt, pdt, name="input_layernorm")(x)
        if self.kind == LINEAR_ATTENTION:
            a, cache, state = self._linear(h, cache, index, ctx, prompt_state)
        else:
            mixer = GatedAttention(cfg, dt, pdt, self.attn_chunk, self.attention, name="self_attn")
            layer_cache = None if cache is None else ((cache["k"], cache["v"]), index)
            a, kv, state = mixer(h, layer_cache, ctx, prompt_state)
            cache = None if cache is None else {**cache, "k": kv[0], "v": kv[1]}
        x = constrain(x + a, "batch", None, None)
        h = OffsetRMSNorm(cfg.rms_norm_eps, dt, pdt, name="post_attention_layernorm")(x)
        x = x + Mlp(cfg, dt, pdt, self.mlp_chunk, name="mlp")(h)
        return constrain(x, "batch", None, None), cache, state

    def _linear(
        self,
        h: jax.Array,
        cache: Cache | None,
        index: jax.Array | None,
        ctx: dict,
        prompt_state: Any,
    ) -> tuple[jax.Array, Cache | None, Any]:
        """The linear attention, its (conv, state) read from the cache at `index` and the new
        ones written back there (in place: each is written after its read); or starting from a
        shared prompt's (conv, state); or, on a prompt pass, from zeros, returning the final
        (conv, state)."""
        mixer = GatedDeltaNet(self.cfg, self.dtype, self.param_dtype, name="linear_attn")
        if cache is None and prompt_state is not None:
            return mixer(h, prompt_state, ctx)[0], None, None
        if cache is None and "return_state" in ctx:
            empty = init_cache(self.cfg, h.shape[0], 0, self.dtype)  # zero conv inputs and state
            a, state = mixer(h, (empty["conv"][0], empty["state"][0]), ctx)
            return a, None, state
        if cache is None:
            return mixer(h, None, ctx)[0], None, None
        names = ("conv", "state")
        state = [jax.lax.dynamic_index_in_dim(cache[n], index, keepdims=False) for n in names]
        a, new = mixer(h, state, ctx)
        for name, y in zip(names, new):
            y = y.astype(cache[name].dtype)
            cache = {**cache, name: jax.lax.dynamic_update_index_in_dim(cache[name], y, index, 0)}
        return a, cache, None


class LayerGroup(nn.Module):
    """One repetition of cfg.layer_pattern (the body of the layer scan). The whole cache is in
    the scan's carry, so a donated cache is updated in place (see `seal_jax.models.qwen_llama`)."""

    cfg: Qwen35Config
    dtype: Any
    param_dtype: Any
    attn_chunk: int = 1024
    mlp_chunk: int = 0
    attention: str = "xla"

    @nn.compact
    def __call__(self, carry: tuple, group: Any, ctx: dict) -> tuple[tuple, tuple | None]:
        """carry (x [B,T,E], the cache or None) -> (the carry after the group, the group's
        layers' states (one per pattern position) on a prompt pass (ctx "return_state"), else
        None).

        group: this repetition's index when there is a cache; the shared prompt's states of the
        group's layers (as a prompt pass returns them) when ctx has "prefix_mask"; else None.
        """
        x, cache = carry
        pattern = self.cfg.layer_pattern
        seen = {LINEAR_ATTENTION: 0, FULL_ATTENTION: 0}
        states = []
        for j, kind in enumerate(pattern):
            # This layer's entry in its kind's cache arrays (ordered as the layers).
            index = None if cache is None else group * pattern.count(kind) + seen[kind]
            prompt_state = group[j] if "prefix_mask" in ctx else None
            seen[kind] += 1
            layer = Qwen35Layer(
                self.cfg,
                kind,
                self.dtype,
                self.param_dtype,
                self.attn_chunk,
                self.mlp_chunk,
                self.attention,
                name=f"l{j}",
            )
            x, cache, state = layer(x, cache, index, ctx, prompt_state)
            states.append(state)
        return (x, cache), (tuple(states) if "return_state" in ctx else None)


class Qwen35(CausalLMHead, nn.Module):
    """The Qwen3.5 causal LM trunk, with the interface of `qwen_llama.DenseDecoder`: returns the
    final hidden states (normed) and the updated cache.

    Attributes as `DenseDecoder`'s; `scan_unroll` counts repetitions of the layer pattern.
    """

    cfg: Qwen35Config
    dtype: Any = jnp.float32
    param_dtype: Any = jnp.float32
    remat: bool = False
    attn_chunk: int = 1024
    mlp_chunk: int = 0
    scan_unroll: int = 1
    attention: str = "xla"

    def setup(self) -> None:
        """Creates the embedding, the scanned layer groups, the final norm and the LM head."""
        cfg = self.cfg
        self.embed_tokens = nn.Embed(
            cfg.vocab_size,
            cfg.hidden_size,
            dtype=self.dtype,
            param_dtype=self.param_dtype,
            embedding_init=nn.initializers.normal(0.02),
        )
        group = nn.remat(LayerGroup, prevent_cse=False) if self.remat else LayerGroup
        self.layers = nn.scan(
            group,
            variable_axes={"params": 0},
            split_rngs={"params": True},
            in_axes=(0, nn.broadcast),
            length=cfg.num_layers // len(cfg.layer_pattern),
            unroll=self.scan_unroll,
        )(cfg, self.dtype, self.param_dtype, self.attn_chunk, self.mlp_chunk, self.attention)
        self.norm = OffsetRMSNorm(cfg.rms_norm_eps, self.dtype, self.param_dtype)
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
        mask = mask.astype(bool)
        ctx = {"rope": rope_tables(positions, self.cfg), "key_mask": mask}
        carried = groups = None
        if cache is not None:
            index = cache["index"]
            ctx.update(cached_visibility(cache["mask"], index, mask))
            carried = {name: cache[name] for name in ("k", "v", "conv", "state")}
            groups = jnp.arange(self.cfg.num_layers // len(self.cfg.layer_pattern))
        x = constrain(self.embed_tokens(input_ids), "batch", None, None)
        (x, carried), _ = self.layers((x, carried), groups, ctx)
        if cache is None:
            return self.norm(x), None
        new_cache = {**cache, **carried}
        advance = t if index.ndim == 0 else jnp.sum(mask, axis=1, dtype=jnp.int32)
        new_cache["mask"] = write_cache(cache["mask"], mask, index, *CACHE_AXES["mask"])
        new_cache["index"] = index + advance
        return self.norm(x), new_cache

    def _after_prompt(
        self, input_ids: jax.Array, positions: jax.Array, mask: jax.Array, prompt: SharedPrompt
    ) -> jax.Array:
        """Final hidden states [B, T, E] of rows that continue their group's shared prompt."""
        ids, prompt_positions, prompt_mask = prompt
        rows_per_prompt = input_ids.shape[0] // ids.shape[0]
        prompt_mask = prompt_mask.astype(bool)
        ctx = {
            "rope": rope_tables(prompt_positions, self.cfg),
            "key_mask": prompt_mask,
            "return_state": (),
        }
        _, states = self.layers((self.embed_tokens(ids), None), None, ctx)
        # Per pattern position, the layers' states [repetitions, G, ...] -> [repetitions, B, ...].
        states = jax.tree.map(lambda a: jnp.repeat(a, rows_per_prompt, axis=1), states)
        ctx = {
            "rope": rope_tables(positions, self.cfg),
            "key_mask": mask.astype(bool),
            "prefix_mask": jnp.repeat(prompt_mask, rows_per_prompt, axis=0),
        }
        (x, _), _ = self.layers((self.embed_tokens(input_ids), None), states, ctx)
        return self.norm(x)


def init_cache(
    cfg: Qwen35Config, batch: int, length: int, dtype: Any = jnp.float32, per_row: bool = False
) -> Cache:
    """An empty cache for `batch` rows and `length` slots (see the module docstring)."""
    kv = (cfg.num_full_layers, batch, cfg.num_kv_heads, length, cfg.head_dim)
    state = (
        cfg.num_linear_layers,
        batch,
        cfg.linear_num_value_heads,
        cfg.linear_key_head_dim,
        cfg.linear_value_head_dim,
    )
    return {
        "k": jnp.zeros(kv, dtype),
        "v": jnp.zeros(kv, dtype),
        "mask": jnp.zeros((batch, length), bool),
        "index": jnp.zeros((batch,) if per_row else (), jnp.int32),
        "conv": jnp.zeros((cfg.num_linear_layers, batch, cfg.conv_kernel - 1, cfg.conv_dim), dtype),
        "state": jnp.zeros(state, jnp.float32),
    }
