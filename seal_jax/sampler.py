"""Next-token sampling: greedy, temperature, top-k and top-p, with the log-probs RL needs.

`sample` returns, for each row, the chosen id and two log-probabilities of it:
  * `logprob`: under the distribution actually sampled from (temperature, then top-k, then top-p
    applied, renormalised); 0 for greedy, whose distribution is a point mass.
  * `raw_logprob`: under the untempered, unfiltered model distribution softmax(logits). This is
    what a teacher-forced forward pass of the policy recomputes.

Randomness is per row: row b draws with `fold_in(row_keys[b], positions[b])`, so a row's tokens
depend only on its own key and position, not on which batch (or batch slot) it was decoded in.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

MODES = ("greedy", "sample")


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    """How to pick the next token.

    Attributes:
      mode: "greedy" (argmax) or "sample".
      temperature: logits are divided by it before sampling (> 0; "sample" only).
      top_k: keep only the k most likely tokens (0: off).
      top_p: keep the smallest set of most likely tokens whose mass reaches top_p (1.0: off).
    """

    mode: str = "sample"
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"unknown sampling mode {self.mode!r}; use one of {MODES}")
        if self.mode == "sample" and not self.temperature > 0:
            raise ValueError(
                f"temperature must be > 0 for sampling (got {self.temperature}); "
                "use mode='greedy' for argmax decoding"
            )
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 disables it), got {self.top_k}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")


def filtered_logits(logits: jax.Array, params: SamplingParams) -> jax.Array:
    """The logits [B, V] of the distribution sampled from: tempered, top-k and top-p filtered.

    Filtered-out tokens get -inf. Ties at a cut-off are kept (a threshold on the value).
    """
    x = logits.astype(jnp.float32) / params.temperature
    if params.top_k == 0 and params.top_p == 1.0:
        return x
    vocab = x.shape[-1]
    # Candidates in descending order: top-k of them, or the whole (sorted) vocabulary for top-p.
    k = min(params.top_k, vocab) if params.top_k else vocab
    ranked = jax.lax.top_k(x, k)[0]
    keep = jnp.ones(ranked.shape, bool)
    if params.top_p < 1.0:
        probs = jax.nn.softmax(ranked, axis=-1)
        mass_before = jnp.cumsum(probs, axis=-1) - probs
        keep = mass_before < params.top_p  # the first token is always kept
    threshold = jnp.min(jnp.where(keep, ranked, jnp.inf), axis=-1, keepdims=True)
    return jnp.where(x >= threshold, x, -jnp.inf)


def sample(
    logits: jax.Array, row_keys: jax.Array, positions: jax.Array, params: SamplingParams
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Picks one token per row.

    Args:
      logits: [B, V] model logits for the next token.
      row_keys: [B] typed PRNG keys (one per row; ignored for greedy).
      positions: [B] int32 position of the token being sampled (folded into the row's key).
      params: the sampling rule (static).

    Returns:
      (ids [B] int32, logprob [B] under the sampled distribution, raw_logprob [B] under
      softmax(logits)), both float32.
    """
    raw = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    if params.mode == "greedy":
        ids = jnp.argmax(logits, axis=-1).astype(jnp.int32)
        logprob = jnp.zeros(ids.shape, jnp.float32)
    else:
        used = filtered_logits(logits, params)
        keys = jax.vmap(jax.random.fold_in)(row_keys, positions)
        ids = jax.vmap(jax.random.categorical)(keys, used).astype(jnp.int32)
        logprob = jnp.take_along_axis(jax.nn.log_softmax(used, axis=-1), ids[:, None], -1)[:, 0]
    return ids, logprob, jnp.take_along_axis(raw, ids[:, None], -1)[:, 0]
