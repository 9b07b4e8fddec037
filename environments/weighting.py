"""Diagnosis-weighted advantages, host side (docs/method.md, "Tag utilities and weights").

Once per training step, after the step's episodes were added to the failure profile
(`environments.profile.FailureProfile`):

1. `update_utilities(...)` moves every tag utility rho one EMA step toward
   `rho0 * (1 + alpha * prevalence * stagnation * confidence)`, clipped to [0.5, 2.0].
2. `trajectory_weights(...)` turns each trajectory's tags into `w = clip(mean rho, 0.5, 2.0)`.
   The device side multiplies the GRPO advantages by them (`seal_jax.rl.weighted_advantages`,
   which also applies the weighting mode, since only it sees the advantages' signs). Weights are
   always > 0, so the sign of an advantage never flips.

`DiagnosisWeighting` bundles the two with the `config.weighting` section and the fine-cause
utilities, and round-trips through `to_dict()` / `from_dict()` (JSON-able) for checkpoints.
Tags of `environments.diagnosis.EXCLUDED_TAGS` take no part.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from environments.diagnosis import EXCLUDED_TAGS
from environments.episode import EpisodeResult
from environments.profile import FailureProfile, TagStatistics, episode_causes

WEIGHT_MIN, WEIGHT_MAX = 0.5, 2.0  # bounds of both utilities' targets and trajectory weights
PASS_TAG = "pass"


def utility_target(
    tag: str,
    count: int,
    mean_reward: float,
    total: int,
    rho0: Mapping[str, float],
    *,
    alpha: float,
    confidence_k: int,
    excluded_tags: Iterable[str],
) -> float:
    """Returns the value rho(tag) moves toward, given its (count, mean reward) out of `total`."""
    if tag in excluded_tags:
        return 1.0
    base = rho0.get(tag, 1.0)
    if tag == PASS_TAG or total == 0:
        return base
    prevalence = count / total
    stagnation = 1.0 - mean_reward
    confidence = min(1.0, count / confidence_k)
    target = base * (1.0 + alpha * prevalence * stagnation * confidence)
    return float(np.clip(target, WEIGHT_MIN, WEIGHT_MAX))


def update_utilities(
    utilities: Mapping[str, float],
    stats: TagStatistics,
    rho0: Mapping[str, float],
    *,
    beta: float,
    alpha: float,
    confidence_k: int,
    excluded_tags: Iterable[str],
    closed_loop: bool = True,
) -> dict[str, float]:
    """One closed-loop step: returns the new utilities, `rho <- (1 - beta) rho + beta target`.

    Covers every tag of `rho0`, of `utilities` and of the statistics; a tag without a utility yet
    starts at rho0 (1.0 if unlisted). `closed_loop=False` returns rho0 unchanged (static ablation).
    """
    if confidence_k <= 0 or not 0.0 <= beta <= 1.0:
        raise ValueError(f"need confidence_k > 0 and 0 <= beta <= 1; got {confidence_k}, {beta}")
    if not closed_loop:
        return {tag: float(value) for tag, value in rho0.items()}
    excluded = set(excluded_tags)
    summary = stats.summary()
    total = sum(count for tag, (count, _) in summary.items() if tag not in excluded)
    updated = {}
    for tag in sorted(set(rho0) | set(utilities) | set(summary)):
        count, mean_reward = summary.get(tag, (0, 0.0))
        target = utility_target(
            tag,
            count,
            mean_reward,
            total,
            rho0,
            alpha=alpha,
            confidence_k=confidence_k,
            excluded_tags=excluded,
        )
        current = utilities.get(tag, rho0.get(tag, 1.0))
        updated[tag] = (1.0 - beta) * current + beta * target
    return updated


def trajectory_weights(
    tags_per_trajectory: Sequence[Sequence[str]],
    utilities: Mapping[str, float],
    *,
    excluded_tags: Iterable[str] = (),
    budget_enabled: bool = False,
    budget_strength: float = 1.0,
    budget_clamp: float = 2.0,
    causes_per_trajectory: Sequence[Sequence[str]] | None = None,
    cause_utilities: Mapping[str, float] | None = None,
) -> np.ndarray:
    """Returns one weight per trajectory, float32 [N], every weight > 0.

    `w = clip(mean of rho(z) over the trajectory's non-excluded tags, 0.5, 2.0)`, 1.0 without
    tags; a tag missing from `utilities` counts as 1.0. With `cause_utilities` given (the switch for
    fine-cause utilities), the fine causes in `causes_per_trajectory` join the averaged values.

    Then the budget (off by default), over tagged trajectories only: shrink toward 1,
    `w <- 1 + (w - 1) / (1 + budget_strength)`; clamp to [1 / budget_clamp, budget_clamp];
    divide by their mean so tagged weights average 1 (total learning signal unchanged).
    """
    if budget_enabled and (budget_strength < 0 or budget_clamp <= 1):
        raise ValueError(
            f"need budget_strength >= 0 and budget_clamp > 1; got {budget_strength}, {budget_clamp}"
        )
    n = len(tags_per_trajectory)
    excluded = set(excluded_tags)
    values = [
        [utilities.get(tag, 1.0) for tag in tags if tag not in excluded]
        for tags in tags_per_trajectory
    ]
    if cause_utilities is not None:
        if causes_per_trajectory is None or len(causes_per_trajectory) != n:
            raise ValueError("cause utilities need causes_per_trajectory, one entry per trajectory")
        for row, causes in zip(values, causes_per_trajectory):
            row.extend(cause_utilities.get(cause, 1.0) for cause in causes)
    tagged = np.array([bool(row) for row in values], dtype=bool)
    weights = np.array([np.mean(row) if row else 1.0 for row in values], dtype=np.float64)
    weights = np.clip(weights, WEIGHT_MIN, WEIGHT_MAX)
    if budget_enabled and tagged.any():
        weights[tagged] = _apply_budget(weights[tagged], budget_strength, budget_clamp)
    return weights.astype(np.float32)


def _apply_budget(weights: np.ndarray, strength: float, clamp: float) -> np.ndarray:
    """Shrinks toward 1, clamps, and renormalises to mean 1 (see `trajectory_weights`)."""
    shrunk = 1.0 + (weights - 1.0) / (1.0 + strength)
    clamped = np.clip(shrunk, 1.0 / clamp, clamp)
    return clamped / clamped.mean()


def weight_metrics(weights: np.ndarray) -> dict[str, float]:
    """Returns mean, min, max and the effective sample size `(sum w)^2 / sum w^2` of weights."""
    weights = np.asarray(weights, dtype=np.float64)
    if weights.size == 0:
        return {}
    return {
        "weight_mean": float(weights.mean()),
        "weight_min": float(weights.min()),
        "weight_max": float(weights.max()),
        "weight_ess": float(weights.sum() ** 2 / np.sum(weights**2)),
    }


class DiagnosisWeighting:
    """The policy side of SEAL's closed loop, configured by `config.weighting`, checkpointable.

    Per step: `update(profile)` once the step's episodes are in the failure profile, then
    `weights(results)` for the step's episodes. Fine causes have utilities of their own
    (prevalence counted among causes), which enter the weights only when `cause_utilities` is on.
    """

    def __init__(self, config: Any) -> None:
        self.config = config
        self.rho0 = {tag: float(value) for tag, value in dict(config.rho0).items()}
        self.utilities = dict(self.rho0)
        self.cause_utilities: dict[str, float] = {}

    def update(self, profile: FailureProfile) -> None:
        """Moves the tag (and fine-cause) utilities one closed-loop step toward the profile."""
        c = self.config
        kwargs = dict(
            beta=c.beta, alpha=c.alpha, confidence_k=c.confidence_k, closed_loop=c.closed_loop
        )
        self.utilities = update_utilities(
            self.utilities, profile.tags, self.rho0, excluded_tags=EXCLUDED_TAGS, **kwargs
        )
        self.cause_utilities = update_utilities(
            self.cause_utilities, profile.causes, {}, excluded_tags=(), **kwargs
        )

    def weights(self, results: Sequence[EpisodeResult]) -> np.ndarray:
        """Returns float32 [N] weights of the episodes; all 1.0 when weighting is disabled."""
        if not self.config.enabled:
            return np.ones(len(results), dtype=np.float32)
        c = self.config
        return trajectory_weights(
            [r.turn_tags for r in results],
            self.utilities,
            excluded_tags=EXCLUDED_TAGS,
            budget_enabled=c.budget_enabled,
            budget_strength=c.budget_strength,
            budget_clamp=c.budget_clamp,
            causes_per_trajectory=[episode_causes(r) for r in results],
            cause_utilities=self.cause_utilities if c.cause_utilities else None,
        )

    def metrics(self) -> dict[str, float]:
        """Returns the current utilities as `utility/<tag>` and `cause_utility/<cause>`."""
        metrics = {f"utility/{tag}": value for tag, value in self.utilities.items()}
        metrics.update({f"cause_utility/{c}": value for c, value in self.cause_utilities.items()})
        return metrics

    def to_dict(self) -> dict[str, Any]:
        """Returns the learned utilities as plain JSON-able data."""
        return {"utilities": dict(self.utilities), "cause_utilities": dict(self.cause_utilities)}

    @classmethod
    def from_dict(cls, config: Any, data: Mapping[str, Any]) -> DiagnosisWeighting:
        """Rebuilds a `DiagnosisWeighting` from `config` and the state written by `to_dict`."""
        missing = {"utilities", "cause_utilities"} - set(data)
        if missing:
            raise ValueError(f"weighting state is missing {sorted(missing)}")
        weighting = cls(config)
        weighting.utilities = {tag: float(v) for tag, v in data["utilities"].items()}
        weighting.cause_utilities = {c: float(v) for c, v in data["cause_utilities"].items()}
        return weighting
