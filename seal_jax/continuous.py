"""Continuous batching: episodes stream through a fixed number of decode slots.

Use (the episode driver is `seal_jax.episodes.stream_episodes`):

    stream = ContinuousRollout(engine, params, slots=32, seed=seed)
    stream.add(prompt_ids, rows=[0, 1, ..., 7])   # a task's G episodes, queued for slots
    while stream.busy:
        for row, turn in stream.step().items():   # replies that ended in this round
            ...                                   # to the environment, asynchronously
        ... when a row's observation arrives: stream.extend(row, env_ids)  (its next turn)
            or, when its episode is over:     stream.finish(row)           (its slot is free)
    sequences = stream.sequences()                # {row: TokenSequence}

A row keeps its slot from its first prompt token to its last turn: its history stays in the
slot's cache rows while the environment works, so a new turn costs only its environment tokens.
One `step` is a scheduling round:
  1. Queued episodes take the free slots. A prompt is prefilled once (all but its last token)
     and copied to the slots of its other rows; each row prefills the last token itself.
  2. The cache is resized (a relayout) when the rows in slots need more slots than it has, or
     fit in half of them. Memory is slots x the cache length, at most slots x context_limit.
  3. The pending tokens of every row about to decode (environment ids, a prompt's last token,
     a reply's last sampled token) are prefilled for those rows only (`prefill_rows`), rows
     grouped by piece width, so a long observation pads no other row, and at most half the
     slots per call (the program copies the rows it prefills).
  4. One decode segment runs over the slots of those rows only (`decode_rows`), or over all
     slots when they are more than half (slots without a turn are idle). It ends as soon as
     `refill` rows have finished their turn (or all, if fewer decode), so their replies reach
     the environment while the other rows' turns go on in the next round.
The programs over some slots pad their rows to a power of two from 1, not `min_batch`: a
padded row there costs a whole piece or segment of work, more than compiling one more shape.
Rows whose turn ended come back from `step`; the others go on in the next round.

Results do not depend on scheduling: a row's token at position p is drawn with
fold_in(fold_in(key(seed), first_row + row), p) (`rollout.row_keys`), so the same seed gives
the same tokens whatever the slot count, the arrival order of observations or the lockstep
engine (`rollout.Rollout`), up to float rounding that differs between batch shapes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from seal_jax import rollout as rollout_lib
from seal_jax.rollout import CONTEXT_LIMIT, RolloutEngine, TokenSequence, Turn

QUEUED, READY, WAITING, DONE = "queued", "ready", "waiting", "done"


@dataclasses.dataclass
class _Episode:
    """Host bookkeeping of one row: its tokens (`rollout._Row`), slot, phase and turn."""

    row: rollout_lib._Row
    key: np.ndarray  # uint32 key data of the row's PRNG key
    phase: str = QUEUED
    slot: int = -1
    turn_start: int = 0  # token count when the current turn started
    end: int = 0  # token count at which the current turn's budget is used up
    first_budget: int | None = None  # the first turn's max_new_tokens (None: the engine's)


class ContinuousRollout:
    """Rows of many episodes decoded in `slots` cache rows; see the module docstring.

    Attributes:
      engine: the rollout engine (its programs, buckets and settings).
      params: the parameters every turn samples from.
      slots: rows decoded together (a multiple of the engine's batch shards).
    """

    def __init__(
        self,
        engine: RolloutEngine,
        params: Any,
        slots: int,
        seed: int,
        first_row: int = 0,
        refill: int = 0,
    ) -> None:
        """Args: the engine, the params, the slot count, the sampling seed, the number of the
        first row in a larger batch sampled with the same seed (see `RolloutEngine.start`), and
        how many finished turns end a decode segment (0: max(1, slots // 8))."""
        if slots < 1 or slots % engine.batch_shards:
            raise ValueError(
                f"slots ({slots}) must be a positive multiple of the engine's batch shards "
                f"({engine.batch_shards})"
            )
        self.engine, self.slots = engine, slots
        self.params = engine.decoding_params(params)
        self.seed, self.first_row = seed, first_row
        self.refill = refill or max(1, slots // 8)
        self._layout = rollout_lib.params_layout(self.params)
        self._episodes: dict[int, _Episode] = {}
        self._queue: list[tuple[list[int], list[int]]] = []  # (prompt, rows not yet in slots)
        self._holder: list[int] = [-1] * slots  # the row in each slot, -1: free
        self._ended: dict[int, Turn] = {}  # turns ended outside a decode (context limit)
        self._cache: dict[str, jax.Array] | None = None
        self._logits: jax.Array | None = None

    # ---- public ------------------------------------------------------------------------------

    def add(
        self,
        prompt: Sequence[int],
        rows: Sequence[int],
        stop_ids: Sequence[int] | None = None,
        max_new_tokens: int | Mapping[int, int] | None = None,
    ) -> None:
        """Queues episodes `rows` (new row numbers) that all start from `prompt`; `stop_ids`
        end their turns (default: the engine's); `max_new_tokens` bounds their first reply, for
        all of them or per row (default: the engine's)."""
        limit = self.engine.config.context_limit
        if not 0 < len(prompt) < limit:
            raise ValueError(f"a prompt needs 1 to {limit - 1} tokens, got {len(prompt)}")
        taken = [r for r in rows if r in self._episodes]
        if taken or not rows:
            raise ValueError(f"rows must be new and not empty; already added: {taken}")
        keys = rollout_lib.row_keys(self.seed, [self.first_row + r for r in rows])
        stops = list(self.engine.config.stop_ids if stop_ids is None else stop_ids)
        for r, key in zip(rows, np.asarray(jax.random.key_data(keys))):
            row = rollout_lib._Row([], [], [], [], len(prompt), stops)
            row.append(prompt, sampled=False)
            first = max_new_tokens
            if isinstance(max_new_tokens, Mapping):
                first = max_new_tokens.get(r)
            self._episodes[r] = _Episode(row, key, first_budget=first)
        self._queue.append((list(map(int, prompt)), list(rows)))

    def extend(self, row: int, env_ids: Sequence[int], max_new_tokens: int | None = None) -> None:
        """Appends a waiting row's environment ids and queues its next turn (at most
        `max_new_tokens`, default the engine's). A row whose ids would leave no room for a
        reply ends with CONTEXT_LIMIT (reported by the next `step`); its ids are not added."""
        ep = self._get(row, WAITING)
        if len(ep.row.tokens) + len(env_ids) >= self.engine.config.context_limit:
            none = np.zeros(0, np.float32)
            self._ended[row] = Turn([], none, none, CONTEXT_LIMIT)
            ep.row.stop_reason = CONTEXT_LIMIT
            self._free(row)
            return
        ep.row.append(env_ids, sampled=False)
        self._start_turn(ep, max_new_tokens)

    def finish(self, row: int) -> None:
        """Ends a row's episode (its sequence is final) and frees its slot."""
        ep = self._episodes[row]
        if ep.phase in (QUEUED, READY):
            raise ValueError(f"row {row} has a turn to run; only waiting rows can finish")
        self._free(row)

    def step(self) -> dict[int, Turn]:
        """One scheduling round (module docstring); returns {row: Turn} of the turns that ended
        in it. Rows whose turns ended wait for `extend` or `finish`."""
        ended, self._ended = self._ended, {}
        self._admit()
        ready = [r for r, ep in self._episodes.items() if ep.phase == READY]
        if not ready:
            return ended
        self._fit_cache()
        self._prefill(
            {r: self._episodes[r].row.tokens[self._episodes[r].row.cached :] for r in ready}
        )
        ended.update(self._decode(ready))
        return ended

    @property
    def busy(self) -> bool:
        """Whether any row is queued, has a turn to run or to report, or waits for the
        environment."""
        return bool(self._ended) or any(ep.phase != DONE for ep in self._episodes.values())

    @property
    def decoding(self) -> bool:
        """Whether a `step` would decode now (rows with a turn to run, or queued rows and a free
        slot), as opposed to every live row waiting for the environment."""
        ready = any(ep.phase == READY for ep in self._episodes.values())
        return ready or bool(self._queue and -1 in self._holder) or bool(self._ended)

    def sequences(self) -> dict[int, TokenSequence]:
        """The token sequence of every row added (live rows as they stand)."""
        return {
            r: TokenSequence(
                token_ids=np.asarray(ep.row.tokens, np.int32),
                loss_mask=np.asarray(ep.row.sampled, bool),
                sampling_logprobs=np.asarray(ep.row.sampling_logprobs, np.float32),
                policy_logprobs=np.asarray(ep.row.policy_logprobs, np.float32),
                prompt_len=ep.row.prompt_len,
                stop_reason=ep.row.stop_reason,
            )
            for r, ep in self._episodes.items()
        }

    # ---- a round -----------------------------------------------------------------------------

    def _get(self, row: int, phase: str) -> _Episode:
        ep = self._episodes.get(row)
        if ep is None or ep.phase != phase:
            have = "not added" if ep is None else ep.phase
            raise ValueError(f"row {row} is {have}, not {phase}")
        return ep

    def _free(self, row: int) -> None:
        ep = self._episodes[row]
        if ep.slot >= 0:
            self._holder[ep.slot] = -1
        ep.phase, ep.slot = DONE, -1

    def _start_turn(self, ep: _Episode, max_new_tokens: int | None) -> None:
        cap, limit = self.engine.config.max_new_tokens, self.engine.config.context_limit
        want = cap if max_new_tokens is None else max_new_tokens
        if not 0 < want <= cap:
            raise ValueError(f"max_new_tokens {want} must be in [1, {cap}]")
        ep.turn_start = len(ep.row.tokens)
        ep.end = ep.turn_start + min(want, limit - ep.turn_start)
        ep.row.stop_reason = ""
        ep.phase = READY

    def _admit(self) -> None:
        """Queued rows into free slots: each admitted prompt is prefilled (but its last token)
        into its first row's slot, then copied to its other rows' slots."""
        heads: dict[int, list[int]] = {}  # head slot -> prompt head ids
        copies: list[tuple[int, int]] = []  # (from slot, to slot)
        free = [s for s, r in enumerate(self._holder) if r < 0]
        while self._queue and free:
            prompt, rows = self._queue[0]
            take, rest = rows[: len(free)], rows[len(free) :]
            self._queue[0] = (prompt, rest)
            if not rest:
                self._queue.pop(0)
            for i, r in enumerate(take):
                slot = free.pop(0)
                ep = self._episodes[r]
                ep.slot, self._holder[slot] = slot, r
                ep.row.cached = len(prompt) - 1
                self._start_turn(ep, ep.first_budget)
                if i == 0:
                    heads[slot] = prompt[:-1]
                else:
                    copies.append((self._episodes[take[0]].slot, slot))
        if not heads:
            return
        self._fit_cache()
        self._copy([(-1, s) for s in heads])  # an empty row, as `new_cache` makes it
        self._prefill_slots(heads)
        self._copy(copies)

    def _needed_len(self) -> int:
        """Cache slots the rows in slots need: their turn's end, or their tokens while waiting."""
        need = [
            ep.end if ep.phase == READY else len(ep.row.tokens)
            for ep in self._episodes.values()
            if ep.slot >= 0
        ]
        return self.engine.cache_len(max(need, default=1))

    def _fit_cache(self) -> None:
        """Creates the cache, or relayouts it to a new length when the rows need more slots or
        would fit in half of them."""
        eng, length = self.engine, self._needed_len()
        if self._cache is None:
            self._cache = eng.call("new_cache", None, self.slots, length)
            vocab = eng.cfg.vocab_size
            self._logits = eng.put_rows(np.zeros((self.slots, vocab), np.float32))
            return
        have = self._cache["mask"].shape[1]
        if length > have or 2 * length <= have:
            rows = jnp.arange(self.slots, dtype=jnp.int32)
            self._cache = eng.call("relayout", 1, (self._cache,), rows, length)

    def _copy(self, pairs: list[tuple[int, int]]) -> None:
        """Copies cache rows (from slot, to slot); from -1: an empty row."""
        if not pairs:
            return
        n = self.engine.batch_bucket(len(pairs))
        src = np.full(n, -1, np.int32)
        dst = np.full(n, self.slots, np.int32)  # out of range: not written
        src[: len(pairs)], dst[: len(pairs)] = zip(*pairs)
        self._cache = self.engine.call("copy_rows", None, self._cache, src, dst)

    def _prefill(self, chunks: dict[int, list[int]]) -> None:
        """Prefills each row's ids into its slot; marks them cached."""
        self._prefill_slots({self._episodes[r].slot: ids for r, ids in chunks.items()})
        for r in chunks:
            self._episodes[r].row.cached = len(self._episodes[r].row.tokens)

    def _prefill_slots(self, chunks: dict[int, list[int]]) -> None:
        """Appends ids to cache rows {slot: ids}, over those rows only; their next-token logits
        are kept. Each call takes, per row, a piece of its remaining ids (`_piece_width`), rows
        grouped by that width: no row is padded to a longer row's width, and a row pads less
        than the narrowest piece."""
        todo = {s: list(ids) for s, ids in chunks.items() if ids}
        while todo:
            groups: dict[int, list[int]] = {}
            for slot, ids in todo.items():
                groups.setdefault(self._piece_width(len(ids)), []).append(slot)
            for width, slots in groups.items():
                # At most half the slots per call: `prefill_rows` holds a copy of the rows it
                # prefills, so its temporaries stay at half the cache.
                step = max(self.slots // 2, self.engine.batch_shards)
                for i in range(0, len(slots), step):
                    some = slots[i : i + step]
                    self._prefill_piece({s: todo[s][:width] for s in some}, width)
                for s in slots:
                    todo[s] = todo[s][width:]
            todo = {s: ids for s, ids in todo.items() if ids}

    def _piece_width(self, n: int) -> int:
        """The prefill width for a row with n ids left: the narrowest width bucket (2^k or
        3 * 2^(k-1), from min_prefill_width to prefill_chunk) that holds them with less padding
        than the narrowest piece, else the widest one they fill."""
        config = self.engine.config
        low, high = config.min_prefill_width, config.prefill_chunk
        buckets = sorted({w for k in range(high.bit_length()) for w in (1 << k, 3 << k >> 1)})
        buckets = [w for w in buckets if low <= w <= high] or [high]
        fits = [w for w in buckets if 0 <= w - n < low]
        return fits[0] if fits else max([w for w in buckets if w <= n], default=buckets[0])

    def _prefill_piece(self, pieces: dict[int, list[int]], width: int) -> None:
        """One `prefill_rows` call: ids {slot: at most `width` ids}, right-padded."""
        eng = self.engine
        n = eng.batch_bucket(len(pieces), fewest=1)
        slots = np.full(n, self.slots, np.int32)  # padding: out of range
        slots[: len(pieces)] = list(pieces)
        ids = np.zeros((n, width), np.int32)
        lengths = np.zeros(n, np.int32)
        for i, p in enumerate(pieces.values()):
            ids[i, : len(p)], lengths[i] = p, len(p)
        self._cache, self._logits = eng.call(
            "prefill_rows",
            self._layout,
            self.params,
            self._cache,
            self._logits,
            slots,
            eng.put_rows(ids),
            eng.put_rows(lengths),
        )

    def _decode(self, ready: list[int]) -> dict[int, Turn]:
        """One decode segment over the slots of the `ready` rows, or over all slots when those
        are more than half (`decode_rows` holds a copy of the rows it decodes); records the
        sampled ids, returns ended turns."""
        eng = self.engine
        held = [s for s, r in enumerate(self._holder) if r in ready]
        n = eng.batch_bucket(len(held), fewest=1)
        rows = held + [self.slots] * (n - len(held)) if 2 * n <= self.slots else range(self.slots)
        eps = [self._episodes[self._holder[s]] if s in held else None for s in rows]
        width = rollout_lib._pow2_at_least(max(len(ep.row.stop_ids) for ep in eps if ep), 4)
        stop = np.full((len(eps), width), -1, np.int32)
        budget = np.zeros(len(eps), np.int32)
        keys = np.zeros((len(eps), 2), np.uint32)
        for i, ep in enumerate(eps):
            if ep:
                stop[i, : len(ep.row.stop_ids)] = ep.row.stop_ids
                budget[i], keys[i] = ep.end - len(ep.row.tokens), ep.key
        floor = max(len(ready) - self.refill, 0)  # end once `refill` turns are over
        per_row = (
            eng.put_rows(jax.random.wrap_key_data(keys)),
            eng.put_rows(budget),
            eng.put_rows(stop),
            np.int32(floor),
        )
        if len(eps) < self.slots:
            self._cache, out = eng.call(
                "decode_rows",
                self._layout,
                self.params,
                self._cache,
                self._logits,
                np.asarray(rows, np.int32),
                *per_row,
            )
        else:
            self._cache, out = eng.call(
                "decode", self._layout, self.params, self._cache, self._logits, *per_row
            )
        out = jax.device_get(out)
        ended = {}
        for i, (s, ep) in enumerate(zip(rows, eps)):
            if not ep:
                continue
            n = int(out["count"][i])
            lps = (out[k][i, :n] for k in ("sampling_logprobs", "policy_logprobs"))
            ep.row.append(out["ids"][i, :n], True, *lps)
            ep.row.cached = len(ep.row.tokens) - 1  # the last sampled token is pending
            reason = self._turn_over(ep)
            if reason:
                ep.row.stop_reason = reason
                ended[self._holder[s]] = Turn(
                    ep.row.tokens[ep.turn_start :],
                    np.asarray(ep.row.sampling_logprobs[ep.turn_start :], np.float32),
                    np.asarray(ep.row.policy_logprobs[ep.turn_start :], np.float32),
                    reason,
                )
        for r, turn in ended.items():
            if turn.stop_reason == CONTEXT_LIMIT:
                self._free(r)
            else:
                self._episodes[r].phase = WAITING
        return ended

    def _turn_over(self, ep: _Episode) -> str:
        """Why the row's turn ended, or "" while it goes on (as `Rollout._end_turn_if_done`)."""
        tokens = ep.row.tokens
        if tokens[-1] in ep.row.stop_ids:
            return rollout_lib.STOP
        if len(tokens) < ep.end:
            return ""
        if len(tokens) >= self.engine.config.context_limit:
            return CONTEXT_LIMIT
        return rollout_lib.MAX_NEW_TOKENS
