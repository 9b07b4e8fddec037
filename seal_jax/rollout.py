"""Rollout engine: batched multi-turn generation with a live KV cache, token-in / token-out.

Use:

    engine = RolloutEngine(cfg, mesh, EngineConfig(context_limit=16384, max_new_tokens=4096,
                                                   stop_ids=chat.stop_ids))
    rollout = engine.start(params, prompt_ids, num_samples=8, seed=step)  # len(prompts) * 8 rows
    turns = rollout.generate()                     # every row samples its first reply
    while ...:                                     # the environment driver parses `turns`
        turns = rollout.generate({row: env_ids for the rows that continue})   # others end
    sequences = rollout.sequences()                # per row: ids, loss mask, log-probs, reason

Row r belongs to prompt r // num_samples. Environment ids are appended as given (render them once
with `seal_jax.chat.ChatFormat`); the finished sequence of a row is exactly prompt ids + sampled ids
+ environment ids in order, and the loss mask is 1 on the sampled ids only.

This is the lockstep schedule: every live row takes its turn together. The same device programs
also serve continuous batching (`seal_jax.continuous`: rows stream through a fixed number of
slots; `prefill_rows`, `decode_rows` and `copy_rows` work on some rows of its cache), with the
same tokens.

Device side: pure functions (`new_cache`, `prefill`, `decode_segment`, `relayout_cache`), jitted
by the engine with explicit shardings, one compiled program per bucket shape, counted and logged:
  * Cache: the model's KV cache with a per-row write pointer (`init_cache(per_row=True)`; for
    Qwen3.5 also the linear layers' convolution and recurrent states, whose size does not depend
    on the history, moved with their rows like the keys and values), so a
    row's slot equals its token position and rows of any raggedness share one cache of
    `cache_len` slots: the smallest power of two or 1.5x a power of two (capped at the context
    limit) holding the longest live row plus its turn budget, so attention reads at most a third
    more slots than needed. It grows between turns, never during one.
  * Prefill: right-padded pieces of at most `prefill_chunk` tokens (power-of-two widths), which
    bounds attention memory for long prompts. Only tokens not yet in the cache are prefilled: a
    new turn costs its environment tokens, never the history.
  * Decode: a `lax.while_loop` over single tokens with the cache donated, run in segments of at
    most `decode_segment` tokens; it exits as soon as every row hit a stop id, its budget or the
    context limit. A row's last sampled token is kept out of the cache ("pending") and prefilled
    with whatever comes next (environment ids, or nothing at a segment boundary), so no forward
    pass is spent on a token whose logits nobody needs.
  * Finished rows stop costing: batch buckets are powers of two of at least `min_batch` rows
    (multiples of the batch-sharded device count). When the rows still decoding fit a smaller
    bucket, at a segment boundary, they move to a compact cache and the rows done with this turn
    are parked in another (they keep their history for the next turn); each turn starts from one
    cache holding only the rows that continue. The G samples of a prompt share one prefill:
    each prompt is prefilled once and its cache row is copied to its G rows.
  * Sharding: batch rows over the mesh's (data, fsdp) axes, KV heads over `tensor`, parameters as
    passed to `start`: the trainer's, or the sampling copy of the engine's layout
    (`sampling_params`, `seal_jax.weight_sync`: tensor-parallel groups, no weight gathers while
    decoding).
"""

from __future__ import annotations

import dataclasses
import functools
import operator
from collections.abc import Hashable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from seal_jax import preemption
from seal_jax.models.architectures import decoding_module, init_cache
from seal_jax.models.config import Qwen35Config, QwenConfig
from seal_jax.models.layers import Cache
from seal_jax.models.qwen35 import CACHE_AXES_35
from seal_jax.models.qwen_llama import unstack_layers
from seal_jax.sampler import SamplingParams, sample
from seal_jax.sharding import BATCH_AXES
from seal_jax.weight_sync import SamplingLayout

STOP = "stop"  # sampled one of the row's stop ids (the stop id is part of the reply)
MAX_NEW_TOKENS = "max_new_tokens"  # the turn used its token budget
# The row reached the context limit (or its next input would not fit); the row ends.
CONTEXT_LIMIT = "context_limit"


@dataclasses.dataclass(frozen=True)
class EngineConfig:
    """Static settings of a rollout engine.

    Attributes:
      context_limit: most tokens a row may hold (prompt + all turns + environment text).
      max_new_tokens: most tokens sampled in one turn (also the decode output buffer width).
      stop_ids: ids that end a turn (e.g. <|im_end|> and <|endoftext|>); overridable per prompt.
      sampling: the sampling rule.
      prefill_chunk: most tokens prefilled per row in one call (a power of two).
      decode_segment: most tokens decoded per compiled loop; rows that finished their turn are
        dropped from the batch between segments when that halves it.
      min_cache_len: fewest cache slots (rounded up to a bucket, see `RolloutEngine.cache_len`).
      min_batch: fewest rows per compiled batch (a power of two). Smaller batches are padded up:
        a few idle rows cost less than compiling programs for batches of 1, 2, 4... (Continuous
        batching's programs over some slots do not pad to it; `seal_jax.continuous`.)
      min_prefill_width: narrowest prefill piece (a power of two), for the same reason.
      cache_dtype: dtype of cached keys and values (default: the compute dtype; float32 on CPU
        meshes, where XLA converts a bfloat16 cache to float32 and back, whole, around every
        write: 4 passes over the cache per layer and token).
      unstack_layers: decode a dense model from a copy of its weights made once per rollout,
        per layer (`qwen_llama.unstack_layers`) and in the compute dtype: XLA's CPU compiler
        copies each layer's weights out of the stacked ones per token (half a float32 decode
        step) and converts float32 weights to a bfloat16 compute dtype per token without
        fusing the cast into the dots (80% of a bfloat16 step). None: on CPU meshes only (TPU
        and GPU read the stack in place and fuse the cast).
    """

    context_limit: int
    max_new_tokens: int
    stop_ids: tuple[int, ...]
    sampling: SamplingParams = SamplingParams()
    prefill_chunk: int = 512
    decode_segment: int = 256
    min_cache_len: int = 256
    min_batch: int = 1
    min_prefill_width: int = 1
    cache_dtype: Any = None
    unstack_layers: bool | None = None

    def __post_init__(self) -> None:
        if not 0 < self.max_new_tokens < self.context_limit:
            raise ValueError(
                f"need 0 < max_new_tokens ({self.max_new_tokens}) < context_limit "
                f"({self.context_limit})"
            )
        for name in ("prefill_chunk", "min_batch", "min_prefill_width"):
            value = getattr(self, name)
            if value < 1 or value & (value - 1):
                raise ValueError(f"{name} must be a power of two, got {value}")
        if self.decode_segment < 1:
            raise ValueError(f"decode_segment must be >= 1, got {self.decode_segment}")

    @classmethod
    def from_config(
        cls,
        rollout_config: Any,
        max_new_tokens: int,
        stop_ids: tuple[int, ...],
        sampling: SamplingParams | None = None,
    ) -> EngineConfig:
        """The settings of `config.rollout` (context limit, prefill chunk, bucket floors) with
        this engine's reply budget, stop ids and sampling rule (default: the field's)."""
        r = rollout_config
        return cls(
            context_limit=r.context_limit,
            max_new_tokens=max_new_tokens,
            stop_ids=tuple(stop_ids),
            sampling=sampling or SamplingParams(),
            prefill_chunk=r.prefill_chunk,
            min_batch=r.min_batch,
            min_prefill_width=r.min_prefill_width,
        )


@dataclasses.dataclass
class Turn:
    """One reply of one row: the sampled ids, their log-probs and why sampling stopped.

    `ids` is empty when the row was stopped at the context limit before it could sample.
    """

    ids: list[int]
    sampling_logprobs: np.ndarray  # float32 [n], under the distribution sampled from
    policy_logprobs: np.ndarray  # float32 [n], under the untempered policy distribution
    stop_reason: str


@dataclasses.dataclass
class TokenSequence:
    """The token sequence of one row, as training consumes it.

    Attributes:
      token_ids: int32 [N] prompt ids, then sampled and environment ids in the order they came.
      loss_mask: bool [N], True exactly on ids the model sampled.
      sampling_logprobs: float32 [N] log-probs of the sampled ids under the distribution sampled
        from (tempered, top-k / top-p filtered; 0 for greedy), 0 on other ids.
      policy_logprobs: float32 [N] log-probs of the sampled ids under the untempered policy
        softmax(logits), 0 on other ids.
      prompt_len: number of prompt ids at the start.
      stop_reason: why the last turn stopped (STOP, MAX_NEW_TOKENS or CONTEXT_LIMIT).
    """

    token_ids: np.ndarray
    loss_mask: np.ndarray
    sampling_logprobs: np.ndarray
    policy_logprobs: np.ndarray
    prompt_len: int
    stop_reason: str


def _pow2_at_least(n: int, minimum: int = 1) -> int:
    return 1 << max(int(n) - 1, minimum - 1, 0).bit_length()


# ---- device programs: pure functions of their arguments, static settings keyword-only ---------

PROGRAMS = (
    "new_cache",
    "prefill",
    "decode",
    "relayout",
    "prefill_rows",
    "copy_rows",
    "decode_rows",
)
PARAMS_FIRST = ("prefill", "decode", "prefill_rows", "decode_rows")


def new_cache(batch: int, length: int, *, cfg: QwenConfig | Qwen35Config, dtype: Any) -> Cache:
    """An empty KV cache of `batch` rows and `length` slots with a write pointer per row."""
    return init_cache(cfg, batch, length, dtype, per_row=True)


def prefill(
    params: Any,
    cache: Cache,
    logits: jax.Array,
    ids: jax.Array,
    lengths: jax.Array,
    *,
    cfg: QwenConfig | Qwen35Config,
    compute_dtype: Any,
) -> tuple[Cache, jax.Array]:
    """Appends right-padded ids [B, T] (lengths [B]) to the cache.

    Returns the cache and the next-token logits [B, V] float32 after each row's last new token
    (the given `logits` [B, V] where lengths == 0).
    """
    model = decoding_module(cfg, params, compute_dtype)
    t = ids.shape[1]
    positions = cache["index"][:, None] + jnp.arange(t)
    mask = jnp.arange(t) < lengths[:, None]
    hidden, cache = model.apply({"params": params}, ids, positions, mask, cache)
    last = jnp.take_along_axis(hidden, jnp.maximum(lengths - 1, 0)[:, None, None], axis=1)
    w = model.apply({"params": params}, method="output_embedding").astype(compute_dtype)
    new = jnp.einsum("be,ev->bv", last[:, 0], w, preferred_element_type=jnp.float32)
    return cache, jnp.where(lengths[:, None] > 0, new, logits)


def decode_segment(
    params: Any,
    cache: Cache,
    logits: jax.Array,
    keys: jax.Array,
    budget: jax.Array,
    stop_ids: jax.Array,
    floor: jax.Array,
    *,
    cfg: QwenConfig | Qwen35Config,
    compute_dtype: Any,
    sampling: SamplingParams,
    segment_len: int,
) -> tuple[Cache, dict[str, jax.Array]]:
    """Samples up to min(budget[b], segment_len) tokens per row (0: row idle) until a stop id in
    stop_ids[b], starting from the next-token logits [B, V]; keys [B] are the rows' PRNG keys.
    The loop also ends as soon as at most `floor` (int32 scalar) rows are still sampling, which
    lets a continuous-batching scheduler refill the slots of rows that finished.

    Returns the cache (all sampled tokens but each row's last are written) and
    {"ids", "sampling_logprobs", "policy_logprobs": [B, segment_len], "count": [B]}.
    """
    model = decoding_module(cfg, params, compute_dtype)
    b, m = logits.shape[0], segment_len
    out = {
        "ids": jnp.zeros((b, m), jnp.int32),
        "sampling_logprobs": jnp.zeros((b, m), jnp.float32),
        "policy_logprobs": jnp.zeros((b, m), jnp.float32),
        "count": jnp.zeros((b,), jnp.int32),
    }

    def pick(state: dict, logits: jax.Array) -> dict:
        live, step = ~state["done"], state["step"]
        tok, sampling_lp, policy_lp = sample(logits, keys, state["cache"]["index"], sampling)
        tok = jnp.where(live, tok, 0)
        new = {"ids": tok, "sampling_logprobs": sampling_lp, "policy_logprobs": policy_lp}
        o = {k: state["out"][k].at[:, step].set(jnp.where(live, v, 0)) for k, v in new.items()}
        o["count"] = state["out"]["count"] + live
        stopped = jnp.any(tok[:, None] == stop_ids, axis=1) | (o["count"] >= budget)
        done = state["done"] | (live & stopped)
        return {**state, "tok": tok, "out": o, "done": done, "step": step + 1}

    def step(state: dict) -> dict:
        feed = ~state["done"]
        index = state["cache"]["index"]
        logits, cache = model.apply(
            {"params": params},
            state["tok"][:, None],
            index[:, None],
            feed[:, None],
            state["cache"],
            method="logits",
        )
        return pick({**state, "cache": cache}, logits[:, 0])

    def going(state: dict) -> jax.Array:
        return (state["step"] < m) & (jnp.sum(~state["done"]) > floor)

    init = {
        "cache": cache,
        "tok": jnp.zeros((b,), jnp.int32),
        "out": out,
        "done": budget <= 0,
        "step": jnp.zeros((), jnp.int32),
    }
    state = jax.lax.while_loop(going, step, pick(init, logits))
    return state["cache"], state["out"]


def relayout_cache(caches: tuple[Cache, ...], rows: jax.Array, length: int) -> Cache:
    """One cache made of batch rows `rows` [B'] of the caches laid end to end (repeats
    allowed), cut or padded to `length` slots."""

    def gather(name: str, axis: int, slot_axis: int | None) -> jax.Array:
        joined = jnp.concatenate([c[name] for c in caches], axis=axis)
        x = jnp.take(joined, rows, axis=axis)
        if slot_axis is None:
            return x
        # The cache may shrink when long rows have ended: the kept rows hold nothing past
        # `length` (it covers their tokens plus this turn's budget).
        x = jax.lax.slice_in_dim(x, 0, min(length, x.shape[slot_axis]), axis=slot_axis)
        widths = [(0, 0)] * x.ndim
        widths[slot_axis] = (0, length - x.shape[slot_axis])
        return jnp.pad(x, widths)

    return {name: gather(name, *CACHE_AXES_35[name]) for name in caches[0]}


def _rows_at(name: str) -> tuple:
    """An index prefix that selects batch rows of cache entry `name` (see CACHE_AXES_35)."""
    return (slice(None),) * CACHE_AXES_35[name][0]


def _take_rows(cache: Cache, logits: jax.Array, slots: jax.Array) -> tuple[Cache, jax.Array]:
    """Cache rows `slots` [K] and their next-token logits (an out-of-range slot: any row)."""
    sub = {n: jnp.take(x, slots, axis=CACHE_AXES_35[n][0], mode="clip") for n, x in cache.items()}
    return sub, jnp.take(logits, slots, axis=0, mode="clip")


def _put_rows(cache: Cache, slots: jax.Array, sub: Cache) -> Cache:
    """The cache with rows `slots` [K] set to `sub`'s (an out-of-range slot writes nothing)."""
    return {n: x.at[(*_rows_at(n), slots)].set(sub[n], mode="drop") for n, x in cache.items()}


def prefill_rows(
    params: Any,
    cache: Cache,
    logits: jax.Array,
    slots: jax.Array,
    ids: jax.Array,
    lengths: jax.Array,
    *,
    cfg: QwenConfig | Qwen35Config,
    compute_dtype: Any,
) -> tuple[Cache, jax.Array]:
    """`prefill` of right-padded ids [K, T] (lengths [K]) into the cache rows `slots` [K] of a
    cache of S rows, and those rows' next-token logits into `logits` [S, V]; slot S (out of
    range) marks padding, which is neither read nor written. Cost: K rows, not S."""
    sub, sub_logits = _take_rows(cache, logits, slots)
    sub, sub_logits = prefill(
        params, sub, sub_logits, ids, lengths, cfg=cfg, compute_dtype=compute_dtype
    )
    return _put_rows(cache, slots, sub), logits.at[slots].set(sub_logits, mode="drop")


def decode_rows(
    params: Any,
    cache: Cache,
    logits: jax.Array,
    slots: jax.Array,
    keys: jax.Array,
    budget: jax.Array,
    stop_ids: jax.Array,
    floor: jax.Array,
    **settings: Any,
) -> tuple[Cache, dict[str, jax.Array]]:
    """`decode_segment` over the cache rows `slots` [K] of a cache of S rows only; keys, budget
    and stop_ids are those K rows', and so are the outputs. Slot S (out of range) marks
    padding: give it budget 0, it is not written. Cost: K rows, not S."""
    sub, sub_logits = _take_rows(cache, logits, slots)
    sub, out = decode_segment(params, sub, sub_logits, keys, budget, stop_ids, floor, **settings)
    return _put_rows(cache, slots, sub), out


def copy_rows(cache: Cache, src: jax.Array, dst: jax.Array) -> Cache:
    """The cache with rows `dst` [K] overwritten by rows `src` [K], or by an empty row (as
    `new_cache` makes it) where src < 0; dst S (out of range) writes nothing."""

    def rows(x: jax.Array, name: str) -> jax.Array:
        axis = CACHE_AXES_35[name][0]
        taken = jnp.take(x, src, axis=axis, mode="clip")
        keep = (src >= 0).reshape((1,) * axis + (-1,) + (1,) * (x.ndim - axis - 1))
        return jnp.where(keep, taken, jnp.zeros((), x.dtype))

    return {n: x.at[(*_rows_at(n), dst)].set(rows(x, n), mode="drop") for n, x in cache.items()}


def _decoding_copy(params: Any, dtype: Any) -> Any:
    """params with the layer weights split per layer (`unstack_layers`) and every floating
    array cast to `dtype`, as the model casts them before use (the same values)."""

    def cast(x: jax.Array) -> jax.Array:
        return x.astype(dtype) if jnp.issubdtype(x.dtype, jnp.floating) else x

    return jax.tree.map(cast, unstack_layers(params))


def row_keys(seed: int, rows: Sequence[int]) -> jax.Array:
    """The PRNG keys of rows `rows` of a batch sampled with `seed`: fold_in(key(seed), row).
    The sampler folds in each token's position, so a token's key depends only on (seed, row,
    position), never on the slot or batch it was decoded in."""
    base = jax.random.key(seed)
    return jax.vmap(functools.partial(jax.random.fold_in, base))(jnp.asarray(rows, jnp.int32))


def params_layout(params: Any) -> tuple[Any, tuple[Any, ...]]:
    """The shardings of params (jax.Arrays) as a hashable key: (treedef, leaf shardings)."""
    leaves, tree = jax.tree.flatten(params)
    return tree, tuple(x.sharding for x in leaves)


class RolloutEngine:
    """Compiled prefill / decode programs for one model on one mesh, shared by all rollouts.

    The engine holds no parameters: each rollout is started with the params it samples from.
    Params of the same shapes and shardings (a policy's successive weights) reuse the compiled
    programs; params laid out differently get programs of their own.
    """

    def __init__(
        self,
        cfg: QwenConfig | Qwen35Config,
        mesh: Mesh,
        config: EngineConfig,
        compute_dtype: Any = jnp.float32,
        layout: SamplingLayout | None = None,
    ) -> None:
        """Args: the architecture, the mesh, the settings, the dtype of activations and
        matmuls, and the sampling layout whose copy of the parameters the engine decodes from
        (`seal_jax.weight_sync`; its mesh is the engine's), if any."""
        if layout is not None and layout.mesh != mesh:
            raise ValueError("the engine's mesh must be its sampling layout's")
        self.cfg, self.mesh, self.config, self.layout = cfg, mesh, config, layout
        self.compute_dtype = compute_dtype
        on_cpu = mesh.devices.flat[0].platform == "cpu"
        self.cache_dtype = config.cache_dtype or (jnp.float32 if on_cpu else compute_dtype)
        unstack = on_cpu if config.unstack_layers is None else config.unstack_layers
        self.unstack_layers = unstack and not isinstance(cfg, Qwen35Config)
        self._last_decoding_copy: tuple[list, Any] = ([], None)
        self._unstack = jax.jit(functools.partial(_decoding_copy, dtype=compute_dtype))
        self.batch_shards = int(np.prod([mesh.shape[a] for a in BATCH_AXES]))
        kv_axis = "tensor" if cfg.num_kv_heads % mesh.shape["tensor"] == 0 else None
        self._cache_sharding = {
            "k": NamedSharding(mesh, P(None, BATCH_AXES, kv_axis, None, None)),
            "v": NamedSharding(mesh, P(None, BATCH_AXES, kv_axis, None, None)),
            "mask": NamedSharding(mesh, P(BATCH_AXES, None)),
            "index": NamedSharding(mesh, P(BATCH_AXES)),
        }
        if isinstance(cfg, Qwen35Config):  # the linear layers' states: rows over the batch axes
            for name, ndim in (("conv", 4), ("state", 5)):
                spec = P(None, BATCH_AXES, *[None] * (ndim - 2))
                self._cache_sharding[name] = NamedSharding(mesh, spec)
        self._rows_2d = NamedSharding(mesh, P(BATCH_AXES, None))
        self._rows_1d = NamedSharding(mesh, P(BATCH_AXES))
        self._programs: dict[tuple[str, Hashable], Any] = {}  # (name, variant) -> jitted program

    # ---- host API --------------------------------------------------------------------------

    def sampling_params(self, params: Any) -> Any:
        """The parameters to start rollouts with: the sampling layout's copy of the trainer's
        params (made chip to chip), or params as they are when the engine has no layout."""
        params = self.layout.copy(params) if self.layout is not None else params
        return self.decoding_params(params)

    def decoding_params(self, params: Any) -> Any:
        """params as the decode programs read them: a per-layer copy in the compute dtype when
        the engine unstacks them (`EngineConfig.unstack_layers`), else params themselves."""
        if not self.unstack_layers or "layers" not in params:
            return params
        leaves = jax.tree.leaves(params)
        # The last copy is reused while the same arrays come back (an evaluation's chunks, a
        # step's rollout chunks); holding those arrays keeps their identities from being reused.
        last_leaves, last_copy = self._last_decoding_copy
        if len(leaves) == len(last_leaves) and all(map(operator.is_, leaves, last_leaves)):
            return last_copy
        with jax.set_mesh(self.mesh):
            copy = self._unstack(params)
        self._last_decoding_copy = (leaves, copy)
        return copy

    def start(
        self,
        params: Any,
        prompts: Sequence[Sequence[int]],
        num_samples: int = 1,
        seed: int = 0,
        stop_ids: Sequence[Sequence[int]] | None = None,
        first_row: int = 0,
    ) -> Rollout:
        """Opens a rollout of len(prompts) * num_samples rows (row r samples prompt r // G).

        Args:
          params: the policy's parameters (jax.Arrays on the engine's mesh), used by every turn
            of this rollout.
          prompts: token ids of each prompt (e.g. `ChatFormat.prompt_ids`).
          num_samples: G, rows per prompt; they share the prompt's prefill.
          seed: sampling seed; row r uses fold_in(key(seed), first_row + r).
          stop_ids: per prompt, the ids that end a turn (default: `config.stop_ids`).
          first_row: the first row's number in a larger batch sampled with the same seed, so a
            row's tokens do not depend on how the batch was split into rollouts.

        Raises:
          ValueError: an empty prompt, or one that leaves no room for a reply in the context.
        """
        limit = self.config.context_limit
        for i, p in enumerate(prompts):
            if not 0 < len(p) < limit:
                raise ValueError(
                    f"prompt {i} has {len(p)} tokens; it must have between 1 and "
                    f"{limit - 1} (context_limit {limit} minus one for the reply)"
                )
        if num_samples < 1 or not prompts:
            raise ValueError(f"need at least one prompt and num_samples >= 1, got {num_samples}")
        if stop_ids is not None and len(stop_ids) != len(prompts):
            raise ValueError(f"stop_ids has {len(stop_ids)} entries for {len(prompts)} prompts")
        prompts = [list(map(int, p)) for p in prompts]
        return Rollout(
            self,
            self.decoding_params(params),
            prompts,
            num_samples,
            row_keys(seed, range(first_row, first_row + len(prompts) * num_samples)),
            stop_ids,
        )

    def compile_counts(self) -> dict[str, int]:
        """How many programs each device program has compiled so far (bounded by the buckets)."""
        counts = dict.fromkeys(PROGRAMS, 0)
        for (name, _), fn in self._programs.items():
            counts[name] += fn._cache_size()
        return counts

    def call(self, name: str, variant: Hashable, *args: Any) -> Any:
        """Runs device program `name` on the mesh and logs when it had to compile a new shape.

        variant: what fixes the program's input shardings besides the engine's: the params'
        `params_layout` for PARAMS_FIRST programs (whose first argument is the params), the
        number of caches for "relayout", None for "new_cache" and "copy_rows".
        """
        fn = self.program(name, variant)
        before = fn._cache_size()
        with jax.set_mesh(self.mesh):
            out = fn(*args)
        if fn._cache_size() > before:
            shown = args[1:] if name in PARAMS_FIRST else args  # not the params
            shapes = jax.tree_util.tree_map(lambda x: getattr(x, "shape", x), list(shown))
            logging.info(
                "rollout: compiled %s #%d for %s", name, self.compile_counts()[name], shapes
            )
        return out

    def program(self, name: str, variant: Hashable) -> Any:
        """The jitted device program `name` for `variant` (see `call`), built on first use."""
        if (name, variant) not in self._programs:
            self._programs[name, variant] = self._jit(name, variant)
        return self._programs[name, variant]

    def abstract_cache(self, batch: int, length: int) -> Cache:
        """A KV cache of `batch` rows and `length` slots as ShapeDtypeStructs with its shardings
        (ahead-of-time compilation, `seal_jax.aot`)."""
        make = functools.partial(new_cache, batch, length, cfg=self.cfg, dtype=self.cache_dtype)
        return {
            name: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=self._cache_sharding[name])
            for name, x in jax.eval_shape(make).items()
        }

    def abstract_rows(self, shape: tuple[int, ...], dtype: Any) -> jax.ShapeDtypeStruct:
        """A per-row array (leading dim: batch rows) as a ShapeDtypeStruct with the row sharding."""
        place = self._rows_2d if len(shape) == 2 else self._rows_1d
        return jax.ShapeDtypeStruct(shape, dtype, sharding=place)

    def cache_len(self, tokens_needed: int) -> int:
        """Cache bucket holding `tokens_needed` tokens per row: 2^k or 3 * 2^(k-1) slots."""
        need = max(tokens_needed, self.config.min_cache_len)
        size = _pow2_at_least(need)
        if size * 3 // 4 >= need:
            size = size * 3 // 4
        return min(size, self.config.context_limit)

    def batch_bucket(self, rows: int, fewest: int | None = None) -> int:
        """Batch bucket for `rows` rows: a power of two of at least `fewest` (default
        `min_batch`), a multiple of the batch shards."""
        bucket = _pow2_at_least(rows, self.config.min_batch if fewest is None else fewest)
        return -(-bucket // self.batch_shards) * self.batch_shards

    @property
    def segment_len(self) -> int:
        """Tokens decoded per compiled loop at most (the width of its output buffers)."""
        return min(self.config.max_new_tokens, self.config.decode_segment)

    def put_rows(self, x: Any) -> jax.Array:
        """Places an array whose leading dim is batch rows with the batch sharding."""
        return jax.device_put(x, self._rows_2d if x.ndim == 2 else self._rows_1d)

    def _jit(self, name: str, variant: Hashable) -> Any:
        """Jits device program `name` (see `call` for `variant`) with explicit shardings: caches
        as `_cache_sharding`, per-row arrays over the batch axes, params as they are laid out."""
        cache, rows_1d, rows_2d = self._cache_sharding, self._rows_1d, self._rows_2d
        if name == "new_cache":
            fn = functools.partial(new_cache, cfg=self.cfg, dtype=self.cache_dtype)
            return jax.jit(fn, static_argnums=(0, 1), out_shardings=cache)
        if name == "copy_rows":
            index = NamedSharding(self.mesh, P())  # a row may come from any shard
            return jax.jit(
                copy_rows,
                in_shardings=(cache, index, index),
                out_shardings=cache,
                donate_argnums=(0,),
            )
        if name == "relayout":
            # Row indices replicated: a shard's new rows may come from any shard.
            shardings = ((cache,) * variant, NamedSharding(self.mesh, P()))
            return jax.jit(
                relayout_cache, static_argnums=(2,), in_shardings=shardings, out_shardings=cache
            )
        params = jax.tree.unflatten(*variant)
        model = {"cfg": self.cfg, "compute_dtype": self.compute_dtype}
        if name == "prefill":
            return jax.jit(
                functools.partial(prefill, **model),
                in_shardings=(params, cache, rows_2d, rows_2d, rows_1d),
                out_shardings=(cache, rows_2d),
                donate_argnums=(1, 2),
            )
        if name == "prefill_rows":
            slots = NamedSharding(self.mesh, P())
            return jax.jit(
                functools.partial(prefill_rows, **model),
                in_shardings=(params, cache, rows_2d, slots, rows_2d, rows_1d),
                out_shardings=(cache, rows_2d),
                donate_argnums=(1, 2),
            )
        settings = {**model, "sampling": self.config.sampling, "segment_len": self.segment_len}
        out = {"ids": rows_2d, "sampling_logprobs": rows_2d, "policy_logprobs": rows_2d}
        out = (cache, {**out, "count": rows_1d})
        scalar = NamedSharding(self.mesh, P())
        if name == "decode_rows":
            return jax.jit(
                functools.partial(decode_rows, **settings),
                in_shardings=(params, cache, rows_2d, scalar, rows_1d, rows_1d, rows_2d, scalar),
                out_shardings=out,
                donate_argnums=(1,),
            )
        return jax.jit(
            functools.partial(decode_segment, **settings),
            in_shardings=(params, cache, rows_2d, rows_1d, rows_1d, rows_2d, scalar),
            out_shardings=out,
            donate_argnums=(1,),
        )


@dataclasses.dataclass
class _Row:
    """Host bookkeeping of one row."""

    tokens: list[int]
    sampled: list[bool]
    sampling_logprobs: list[float]
    policy_logprobs: list[float]
    prompt_len: int
    stop_ids: list[int]
    cached: int = 0  # tokens[:cached] are in the KV cache
    stop_reason: str = ""
    finished: bool = False

    def append(
        self, ids: Sequence[int], sampled: bool, sampling_lp: Any = None, policy_lp: Any = None
    ) -> None:
        zeros = [0.0] * len(ids)
        self.tokens += list(map(int, ids))
        self.sampled += [sampled] * len(ids)
        self.sampling_logprobs += zeros if sampling_lp is None else list(map(float, sampling_lp))
        self.policy_logprobs += zeros if policy_lp is None else list(map(float, policy_lp))


class Rollout:
    """A batch of live rows on one engine; see the module docstring for the loop.

    Attributes:
      params: the parameters every turn samples from (given to `RolloutEngine.start`).
      prompts: the prompt ids; row r samples prompts[r // num_samples].
      num_samples: G, rows per prompt.
      num_rows: len(prompts) * num_samples.
    """

    def __init__(
        self,
        engine: RolloutEngine,
        params: Any,
        prompts: list[list[int]],
        num_samples: int,
        keys: jax.Array,
        stop_ids: Sequence[Sequence[int]] | None,
    ) -> None:
        """Built by `RolloutEngine.start`; keys [rows] are the rows' PRNG keys."""
        self.engine, self.params, self.prompts = engine, params, prompts
        self.num_samples = num_samples
        self._layout = params_layout(params)
        self.num_rows = len(prompts) * num_samples
        self._rows = []
        for r in range(self.num_rows):
            prompt = prompts[r // num_samples]
            stops = engine.config.stop_ids if stop_ids is None else stop_ids[r // num_samples]
            row = _Row([], [], [], [], len(prompt), list(stops))
            row.append(prompt, sampled=False)
            self._rows.append(row)
        self._row_keys = keys
        # The KV caches holding live rows: (cache, row held by each batch slot, -1 for none).
        # One cache between turns; during a turn, rows done early may be parked in a second.
        self._parts: list[tuple[dict[str, jax.Array], list[int]]] = []
        self._started = False

    # ---- public ------------------------------------------------------------------------------

    def generate(
        self,
        env_ids: Mapping[int, Sequence[int]] | None = None,
        max_new_tokens: int | Mapping[int, int] | None = None,
    ) -> dict[int, Turn]:
        """Runs one model turn.

        Args:
          env_ids: None on the first call (every row replies to its prompt). Later, for each row
            that continues, the environment ids to append before its next reply (may be empty);
            every live row not listed ends (its sequence is final). A row whose ids would leave
            no room for a reply ends with CONTEXT_LIMIT and its ids are not appended.
          max_new_tokens: this turn's budget, for all rows or per row (<= config.max_new_tokens).

        Returns:
          {row: Turn} for every row this call concerned (the continuing ones).
        """
        first_turn = not self._started
        rows = self._rows_for_turn(env_ids)
        turns, going = {}, []
        for r in rows:
            row = self._rows[r]
            extra = env_ids[r] if env_ids is not None else []
            if len(row.tokens) + len(extra) >= self.engine.config.context_limit:
                row.finished, row.stop_reason = True, CONTEXT_LIMIT
                turns[r] = Turn([], np.zeros(0, np.float32), np.zeros(0, np.float32), CONTEXT_LIMIT)
                continue
            row.append(extra, sampled=False)
            going.append(r)
        if not going:
            self._parts = []
            return turns
        budgets = {r: self._budget(r, max_new_tokens) for r in going}
        for r in going:
            self._rows[r].stop_reason = ""  # "" while the turn goes on
        start = {r: len(self._rows[r].tokens) for r in going}
        length = self.engine.cache_len(max(start[r] + budgets[r] for r in going))
        if first_turn:
            self._prefill_prompts(length)
        self._regroup(going, [], length)
        active = going
        while active:
            preemption.check()  # a stop signal abandons a training rollout here
            if self.engine.batch_bucket(len(active)) < len(self._parts[0][1]):
                self._regroup(active, [r for r in going if r not in active], length)
            self._decode_segment({r: start[r] + budgets[r] for r in active})
            active = [r for r in active if self._rows[r].stop_reason == ""]
        for r in going:
            row, n = self._rows[r], start[r]
            turns[r] = Turn(
                row.tokens[n:],
                np.asarray(row.sampling_logprobs[n:], np.float32),
                np.asarray(row.policy_logprobs[n:], np.float32),
                row.stop_reason,
            )
        return turns

    def sequences(self) -> list[TokenSequence]:
        """The token sequences of all rows (call when the driver is done; live rows included)."""
        return [
            TokenSequence(
                token_ids=np.asarray(row.tokens, np.int32),
                loss_mask=np.asarray(row.sampled, bool),
                sampling_logprobs=np.asarray(row.sampling_logprobs, np.float32),
                policy_logprobs=np.asarray(row.policy_logprobs, np.float32),
                prompt_len=row.prompt_len,
                stop_reason=row.stop_reason,
            )
            for row in self._rows
        ]

    def live_rows(self) -> list[int]:
        """Rows that can still take another turn."""
        return [r for r, row in enumerate(self._rows) if not row.finished]

    # ---- steps of a turn ---------------------------------------------------------------------

    def _rows_for_turn(self, env_ids: Mapping[int, Sequence[int]] | None) -> list[int]:
        """Validates env_ids, ends the live rows it leaves out, returns the continuing rows."""
        first = not self._started
        if first != (env_ids is None):
            raise ValueError(
                "pass env_ids=None on the first generate() call and a {row: ids} mapping after"
            )
        self._started = True
        if first:
            return list(range(self.num_rows))
        bad = [r for r in env_ids if not 0 <= r < self.num_rows or self._rows[r].finished]
        if bad:
            raise ValueError(f"rows {bad} are not live rows of this rollout")
        for r in self.live_rows():
            if r not in env_ids:
                self._rows[r].finished = True
        return sorted(env_ids)

    def _budget(self, r: int, max_new_tokens: int | Mapping[int, int] | None) -> int:
        cap = self.engine.config.max_new_tokens
        if isinstance(max_new_tokens, Mapping):
            want = max_new_tokens.get(r, cap)
        else:
            want = cap if max_new_tokens is None else max_new_tokens
        if not 0 < want <= cap:
            raise ValueError(f"max_new_tokens {want} for row {r} must be in [1, {cap}]")
        return min(want, self.engine.config.context_limit - len(self._rows[r].tokens))

    def _prefill_prompts(self, length: int) -> None:
        """Prefills each distinct prompt once, into the slot of its first row.

        The last prompt token stays pending: each row prefills it itself, which gives the row its
        first logits without carrying logits through the copy to G rows.
        """
        eng, g = self.engine, self.num_samples
        batch = eng.batch_bucket(len(self.prompts))
        cache = eng.call("new_cache", None, batch, length)
        chunks = [p[:-1] for p in self.prompts] + [[]] * (batch - len(self.prompts))
        cache, _ = self._run_prefill(cache, chunks)
        slots = [p * g for p in range(len(self.prompts))]
        self._parts = [(cache, slots + [-1] * (batch - len(slots)))]
        for row in self._rows:
            row.cached = row.prompt_len - 1

    def _regroup(self, active: list[int], parked: list[int], length: int) -> None:
        """Lays the caches out as [rows `active`] (+ [rows `parked`]), `length` slots each."""
        parts, eng = self._parts, self.engine
        if len(parts) == 1 and not parked and parts[0][0]["mask"].shape[1] == length:
            batch = eng.batch_bucket(len(active))
            if parts[0][1] == active + [-1] * (batch - len(active)):
                return
        offset, where = 0, {}
        for _, slots in parts:
            where.update({r: offset + i for i, r in enumerate(slots) if r >= 0})
            offset += len(slots)
        caches = tuple(c for c, _ in parts)
        new_parts = []
        for rows in (active, parked) if parked else (active,):
            batch = eng.batch_bucket(len(rows))
            # Before the first turn only each prompt's first row is in a cache (_prefill_prompts):
            # its G siblings copy that row. Empty slots copy any row; they stay idle.
            owner = [where[r] if r in where else where[r - r % self.num_samples] for r in rows]
            owner += [0] * (batch - len(rows))
            rows_at = jnp.asarray(owner, jnp.int32)
            cache = eng.call("relayout", len(caches), caches, rows_at, length)
            new_parts.append((cache, rows + [-1] * (batch - len(rows))))
        self._parts = new_parts

    def _run_prefill(
        self, cache: dict[str, jax.Array], chunks: list[list[int]]
    ) -> tuple[dict[str, jax.Array], jax.Array]:
        """Appends each slot's chunk to the cache in right-padded pieces of at most
        prefill_chunk tokens; returns the cache and each slot's next-token logits."""
        eng, piece = self.engine, self.engine.config.prefill_chunk
        logits = eng.put_rows(np.zeros((len(chunks), eng.cfg.vocab_size), np.float32))
        for start in range(0, max(len(c) for c in chunks), piece):
            parts = [c[start : start + piece] for c in chunks]
            width = min(_pow2_at_least(max(map(len, parts)), eng.config.min_prefill_width), piece)
            ids = np.zeros((len(parts), width), np.int32)
            for i, p in enumerate(parts):
                ids[i, : len(p)] = p
            lengths = np.asarray([len(p) for p in parts], np.int32)
            ids, lengths = eng.put_rows(ids), eng.put_rows(lengths)
            cache, logits = eng.call(
                "prefill", self._layout, self.params, cache, logits, ids, lengths
            )
        return cache, logits

    def _decode_segment(self, end: dict[int, int]) -> None:
        """Prefills the active rows' pending tokens, decodes one segment and records it.

        end: for each active row, the token count at which its turn's budget is used up.
        """
        eng = self.engine
        cache, slots = self._parts[0]
        rows = [self._rows[r] if r in end else None for r in slots]
        cache, logits = self._run_prefill(
            cache, [row.tokens[row.cached :] if row else [] for row in rows]
        )
        width = _pow2_at_least(max(len(row.stop_ids) for row in rows if row), 4)
        stop = np.full((len(slots), width), -1, np.int32)
        budget = np.zeros(len(slots), np.int32)
        for i, (r, row) in enumerate(zip(slots, rows)):
            if row:
                stop[i, : len(row.stop_ids)] = row.stop_ids
                budget[i] = end[r] - len(row.tokens)
        keys = eng.put_rows(self._row_keys[np.maximum(np.asarray(slots), 0)])
        budget, stop = eng.put_rows(budget), eng.put_rows(stop)
        floor = np.int32(0)  # a turn runs until every row is done
        cache, out = eng.call(
            "decode", self._layout, self.params, cache, logits, keys, budget, stop, floor
        )
        self._parts[0] = (cache, slots)
        out = jax.device_get(out)
        for i, (r, row) in enumerate(zip(slots, rows)):
            if row:
                n = int(out["count"][i])
                lps = (out[k][i, :n] for k in ("sampling_logprobs", "policy_logprobs"))
                row.append(out["ids"][i, :n], True, *lps)
                row.cached = len(row.tokens) - 1  # the last sampled token is pending
                row.stop_reason = self._end_turn_if_done(row, end[r])

    def _end_turn_if_done(self, row: _Row, end: int) -> str:
        """Why the row's turn ended (the context limit also ends the row), or "" while the turn
        goes on."""
        if row.tokens[-1] in row.stop_ids:
            return STOP
        if len(row.tokens) < end:
            return ""
        if len(row.tokens) >= self.engine.config.context_limit:
            row.finished = True
            return CONTEXT_LIMIT
        return MAX_NEW_TOKENS
