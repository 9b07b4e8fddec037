"""The RL objective on device: GRPO advantages, the PPO-clip + KL policy loss (docs/method.md 1, 6).

Per step: `grpo_advantages(rewards, group_ids)` and the host's per-trajectory weights
(`environments.weighting`) -> `weighted_advantages(advantages, weights, mode)` -> the batch below
-> `make_loss_fn(logprob_fn, config.rl)` -> `seal_jax.train_step.make_train_step`.

Batch layout (a dict; every array has the leading batch dim B, one row per trajectory, T the
bucketed length; every per-token array is aligned to `targets`):

  input_ids    [B, T] int32   packed tokens: prompt, model turns, observations, right padding
  positions    [B, T] int32   position ids
  mask         [B, T] bool    valid (non-padding) tokens
  targets      [B, T] int32   next tokens, `targets[:, t] = input_ids[:, t + 1]` (last: any id,
                              with loss_mask False)
  loss_mask    [B, T] bool    True where `targets[:, t]` was sampled by the model
  old_logprobs [B, T] f32     log-prob of `targets` under the rollout policy
  ref_logprobs [B, T] f32     log-prob under the frozen reference (required when kl_coef > 0)
  advantages   [B] f32        already-weighted advantage per trajectory
  loss_norm    [B] f32        optional: the step batch's loss normaliser, the same on every row

Optionally, a prompt shared by each group of B / G consecutive rows (one task's rollouts), run
once per group (`seal_jax.trajectories.training_batch(..., group_size)`); the rows' arrays then
start at the prompt's last id:

  prompt_ids, prompt_positions [G, P] int32, prompt_mask [G, P] bool   (PROMPT_KEYS)

Loss aggregation is linear: `loss = sum_{b,t} l[b,t] * s[b,t] / loss_norm[b]`, where the per-token
scale `s` only needs its own row (1, 1 / tokens in the row, or 1 / loss_token_norm) and
`loss_norm` is fixed for the whole step batch (total loss tokens, or sequences with a loss token).
So the loss and its gradient are plain sums over rows: splitting the batch into micro-batches whose
losses (and gradients) are summed, or sharding rows over devices, gives the same value. The
normaliser is carried per row so that it shards with the batch; `split_micro_batches` in
`seal_jax.train_step` fills it in. Without `loss_norm` the batch is its own normaliser.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp

LOSS_AGGS = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm")
KL_ESTIMATORS = ("k1", "k2", "k3")
# Which trajectories the diagnosis weights apply to: all, or those whose advantage is > 0 / < 0.
WEIGHT_MODES = ("all", "positive", "negative")
# The PPO ratio's denominator: a forward pass of the trainer, or the rollout engine's log-probs.
OLD_LOGPROBS = ("recompute", "sampler")
K3_MAX = 10.0  # verl clamps the low-variance KL estimate to [-10, 10]

LogprobFn = Callable[..., jax.Array | tuple[jax.Array, jax.Array]]
PROMPT_KEYS = ("prompt_ids", "prompt_positions", "prompt_mask")


def shared_prompt(batch: Mapping[str, Any]) -> tuple[Any, Any, Any] | None:
    """The batch's shared prompt (ids, positions, mask), or None when rows hold whole sequences."""
    return tuple(batch[k] for k in PROMPT_KEYS) if PROMPT_KEYS[0] in batch else None


def grpo_advantages(
    rewards: jax.Array, group_ids: jax.Array, *, eps: float = 1e-6, std_normalize: bool = True
) -> jax.Array:
    """Group-relative advantages `(r - mean_g) / (std_g + eps)`, float32 [N].

    rewards: [N] float; group_ids: [N] int, any values (rollouts of one task share one id).
    std is the unbiased one; `std_normalize=False` returns `r - mean_g`. A group of one, or whose
    rewards are all equal, gets exactly 0. Pairwise [N, N] masks: N is small (tasks x G).
    """
    rewards = jnp.asarray(rewards, jnp.float32)
    if rewards.ndim != 1 or jnp.shape(group_ids) != rewards.shape:
        raise ValueError(
            f"need rewards [N] and group_ids [N]; got {rewards.shape}, {jnp.shape(group_ids)}"
        )
    same = jnp.asarray(group_ids)[:, None] == jnp.asarray(group_ids)[None, :]
    count = same.sum(axis=1)
    mean = jnp.where(same, rewards[None, :], 0.0).sum(axis=1) / count
    centered = rewards - mean
    squares = jnp.where(same, (rewards[None, :] - mean[:, None]) ** 2, 0.0).sum(axis=1)
    std = jnp.sqrt(squares / jnp.maximum(count - 1, 1))
    advantages = centered / (std + eps) if std_normalize else centered
    return jnp.where(_group_is_constant(rewards, same), 0.0, advantages)


def _group_is_constant(rewards: jax.Array, same: jax.Array) -> jax.Array:
    """[N] bool: the row's group has one reward value only (size 1 included)."""
    group_max = jnp.where(same, rewards[None, :], -jnp.inf).max(axis=1)
    group_min = jnp.where(same, rewards[None, :], jnp.inf).min(axis=1)
    return group_max == group_min


def zero_advantage_group_fraction(rewards: jax.Array, group_ids: jax.Array) -> jax.Array:
    """Fraction of groups whose rewards are all equal (so they carry no learning signal)."""
    rewards = jnp.asarray(rewards, jnp.float32)
    same = jnp.asarray(group_ids)[:, None] == jnp.asarray(group_ids)[None, :]
    per_row_share = 1.0 / same.sum(axis=1)  # each group's rows add up to one group
    constant = _group_is_constant(rewards, same)
    return jnp.sum(jnp.where(constant, per_row_share, 0.0)) / jnp.sum(per_row_share)


def weighted_advantages(advantages: jax.Array, weights: jax.Array, mode: str = "all") -> jax.Array:
    """Returns `advantages * w`, float32 [N], from advantages and the host's weights [N].

    `mode` (WEIGHT_MODES): "all" uses the weights as they are; "positive" / "negative" only where
    the advantage is > 0 / < 0, 1 elsewhere (`w = 1 + (weights - 1) * mask`). Weights are > 0, so
    signs are kept.
    """
    _check_choice("weighting mode", mode, WEIGHT_MODES)
    if jnp.shape(advantages) != jnp.shape(weights) or jnp.ndim(advantages) != 1:
        raise ValueError(
            f"need advantages and weights of shape [N]; got {jnp.shape(advantages)}, "
            f"{jnp.shape(weights)}"
        )
    advantages = jnp.asarray(advantages, jnp.float32)
    weights = jnp.asarray(weights, jnp.float32)
    if mode != "all":
        mask = advantages > 0 if mode == "positive" else advantages < 0
        weights = jnp.where(mask, weights, 1.0)
    return advantages * weights


def token_advantages(advantages: jax.Array, loss_mask: jax.Array) -> jax.Array:
    """Broadcasts per-trajectory advantages [B] over the model tokens; returns [B, T]."""
    advantages = jnp.asarray(advantages, jnp.float32)
    if advantages.shape != loss_mask.shape[:1]:
        raise ValueError(f"advantages must be [B] = {loss_mask.shape[:1]}; got {advantages.shape}")
    return jnp.where(loss_mask, advantages[:, None], 0.0)


def loss_normalizer(loss_mask: jax.Array, loss_agg: str) -> jax.Array:
    """The step batch's normaliser: loss tokens for token-mean, else sequences with a loss token."""
    _check_choice("loss_agg", loss_agg, LOSS_AGGS)
    if loss_agg == "token-mean":
        return jnp.sum(loss_mask, dtype=jnp.float32)
    return jnp.sum(jnp.any(loss_mask, axis=-1), dtype=jnp.float32)


def _token_scale(loss_mask: jax.Array, loss_agg: str, loss_token_norm: float) -> jax.Array:
    """Per-token factor of the aggregation that depends on the token's own row only, [B, T]."""
    mask = loss_mask.astype(jnp.float32)
    if loss_agg == "token-mean":
        return mask
    if loss_agg == "seq-mean-token-mean":
        return mask / jnp.maximum(mask.sum(axis=-1, keepdims=True), 1.0)
    return mask / loss_token_norm


def kl_penalty(
    logprobs: jax.Array, ref_logprobs: jax.Array, estimator: str, clamp: float
) -> jax.Array:
    """Per-token estimate of KL(policy || reference) from sampled tokens, verl's definitions.

    k1 = log p - log q; k2 = (log p - log q)^2 / 2; k3 ("low_var_kl") = q/p - log(q/p) - 1, with
    log(q/p) clamped to [-clamp, clamp] and the result to [-10, 10] as verl does.
    """
    _check_choice("kl_estimator", estimator, KL_ESTIMATORS)
    log_ratio = logprobs - ref_logprobs
    if estimator == "k1":
        return log_ratio
    if estimator == "k2":
        return 0.5 * jnp.square(log_ratio)
    ref_log_ratio = jnp.clip(-log_ratio, -clamp, clamp)
    return jnp.clip(jnp.exp(ref_log_ratio) - ref_log_ratio - 1.0, -K3_MAX, K3_MAX)


def policy_loss(
    logprobs: jax.Array,
    old_logprobs: jax.Array,
    advantages: jax.Array,
    loss_mask: jax.Array,
    *,
    ref_logprobs: jax.Array | None = None,
    entropy: jax.Array | None = None,
    loss_norm: jax.Array | None = None,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    dual_clip: float = 10.0,
    log_ratio_clamp: float = 20.0,
    kl_coef: float = 0.001,
    kl_estimator: str = "k3",
    entropy_coef: float = 0.0,
    loss_agg: str = "token-mean",
    loss_token_norm: float = 8192.0,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """PPO-clip policy-gradient loss with a KL penalty and an optional entropy bonus.

    Inputs are [B, T] and aligned (advantages are [B]); gradients flow through `logprobs` (and
    `entropy`). Per token: `ratio = exp(clip(logp - old, +-log_ratio_clamp))`, the PPO term
    `max(-A ratio, -A clip(ratio, 1 - clip_low, 1 + clip_high))`, and for A < 0 the dual clip
    caps it at `-A dual_clip` (verl; 0 disables, otherwise it must exceed 1). Token terms
    `pg + kl_coef kl - entropy_coef entropy` are aggregated by `loss_agg` against `loss_norm`
    ([B], the step batch's normaliser on every row; default: this batch's `loss_normalizer`).
    Defaults are the paper's (configs/base.py).

    Returns (scalar loss, metrics). Metrics are means over this call's loss tokens, except the
    loss parts, which are this call's contributions to the step's loss.
    """
    _check_loss_inputs(logprobs, old_logprobs, loss_mask, ref_logprobs, entropy, loss_agg)
    _check_choice("kl_estimator", kl_estimator, KL_ESTIMATORS)
    if dual_clip and dual_clip <= 1.0:
        raise ValueError(f"dual_clip must be 0 (off) or > 1; got {dual_clip}")
    if kl_coef and ref_logprobs is None:
        raise ValueError("kl_coef > 0 needs ref_logprobs in the batch")
    if entropy_coef and entropy is None:
        raise ValueError("entropy_coef > 0 needs per-token entropy from the log-prob function")

    advantages = token_advantages(advantages, loss_mask)
    ratio = jnp.exp(jnp.clip(logprobs - old_logprobs, -log_ratio_clamp, log_ratio_clamp))
    unclipped = -advantages * ratio
    clipped = -advantages * jnp.clip(ratio, 1.0 - clip_low, 1.0 + clip_high)
    pg = jnp.maximum(unclipped, clipped)
    dual_clipped = jnp.zeros(loss_mask.shape, bool)
    if dual_clip:
        cap = -advantages * dual_clip  # only binds where A < 0: there it is |A| * dual_clip
        dual_clipped = (advantages < 0) & (pg > cap)
        pg = jnp.where(dual_clipped, cap, pg)

    if loss_norm is None:
        loss_norm = jnp.full(loss_mask.shape[:1], loss_normalizer(loss_mask, loss_agg))
    scale = _token_scale(loss_mask, loss_agg, loss_token_norm)
    scale = scale / jnp.maximum(loss_norm, 1.0)[:, None]

    def aggregate(per_token: jax.Array) -> jax.Array:
        return jnp.sum(jnp.where(loss_mask, per_token, 0.0) * scale)

    pg_loss = aggregate(pg)
    loss = pg_loss
    metrics = {"pg_loss": pg_loss}
    if ref_logprobs is not None:
        kl = kl_penalty(logprobs, ref_logprobs, kl_estimator, log_ratio_clamp)
        metrics["kl_loss"] = aggregate(kl)
        metrics["ref_kl"] = _token_mean(kl, loss_mask)
        loss = loss + kl_coef * metrics["kl_loss"]
    if entropy is not None:
        metrics["entropy_loss"] = aggregate(entropy)
        metrics["entropy"] = _token_mean(entropy, loss_mask)
        loss = loss - entropy_coef * metrics["entropy_loss"]

    metrics.update(
        clip_fraction=_token_mean(clipped > unclipped, loss_mask),
        dual_clip_fraction=_token_mean(dual_clipped, loss_mask),
        approx_kl=_token_mean(kl_penalty(logprobs, old_logprobs, "k3", log_ratio_clamp), loss_mask),
        ratio_min=jnp.min(jnp.where(loss_mask, ratio, jnp.inf)),
        ratio_max=jnp.max(jnp.where(loss_mask, ratio, -jnp.inf)),
        advantage_abs_mean=_token_mean(jnp.abs(advantages), loss_mask),
        loss_tokens=jnp.sum(loss_mask, dtype=jnp.float32),
    )
    return loss, metrics


def _check_loss_inputs(
    logprobs: jax.Array,
    old_logprobs: jax.Array,
    loss_mask: jax.Array,
    ref_logprobs: jax.Array | None,
    entropy: jax.Array | None,
    loss_agg: str,
) -> None:
    """Raises ValueError unless every per-token input is the same [B, T] and loss_agg is known."""
    _check_choice("loss_agg", loss_agg, LOSS_AGGS)
    inputs = {"logprobs": logprobs, "old_logprobs": old_logprobs, "loss_mask": loss_mask}
    inputs.update(ref_logprobs=ref_logprobs, entropy=entropy)
    shapes = {name: jnp.shape(x) for name, x in inputs.items() if x is not None}
    if len(set(shapes.values())) != 1 or jnp.ndim(logprobs) != 2:
        raise ValueError(f"per-token inputs must all be [B, T]; got {shapes}")


def _token_mean(values: jax.Array, loss_mask: jax.Array) -> jax.Array:
    """Mean of `values` over the loss tokens (0 when there are none)."""
    values = jax.lax.stop_gradient(values).astype(jnp.float32)
    total = jnp.sum(jnp.where(loss_mask, values, 0.0))
    return total / jnp.maximum(jnp.sum(loss_mask, dtype=jnp.float32), 1.0)


def policy_loss_options(rl_config: Any) -> dict[str, Any]:
    """Maps the `config.rl` section onto `policy_loss` keyword arguments."""
    names = (
        "clip_low",
        "clip_high",
        "dual_clip",
        "log_ratio_clamp",
        "kl_coef",
        "kl_estimator",
        "entropy_coef",
        "loss_agg",
        "loss_token_norm",
    )
    return {name: getattr(rl_config, name) for name in names}


def make_loss_fn(
    logprob_fn: LogprobFn, rl_config: Any
) -> Callable[[Any, Mapping[str, jax.Array]], tuple[jax.Array, dict[str, jax.Array]]]:
    """Returns `loss_fn(params, batch) -> (loss, metrics)` over a batch laid out as above.

    `logprob_fn(params, input_ids, positions, mask, targets)` returns the [B, T] float32 log-probs
    of `targets`, or a pair (log-probs, per-token entropy) when an entropy term is wanted; for a
    batch with a shared prompt it is also passed `prompt=(ids, positions, mask)`.
    """
    options = policy_loss_options(rl_config)

    def loss_fn(
        params: Any, batch: Mapping[str, jax.Array]
    ) -> tuple[jax.Array, dict[str, jax.Array]]:
        prompt = shared_prompt(batch)
        args = (params, batch["input_ids"], batch["positions"], batch["mask"], batch["targets"])
        out = logprob_fn(*args) if prompt is None else logprob_fn(*args, prompt=prompt)
        logprobs, entropy = out if isinstance(out, tuple) else (out, None)
        return policy_loss(
            logprobs,
            batch["old_logprobs"],
            batch["advantages"],
            batch["loss_mask"],
            ref_logprobs=batch.get("ref_logprobs"),
            entropy=entropy,
            loss_norm=batch.get("loss_norm"),
            **options,
        )

    return loss_fn


def _check_choice(name: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"unknown {name} {value!r}; expected one of {choices}")
