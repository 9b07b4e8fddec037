"""Episode rewards from the environment's verdicts, one kind per `config.rl.reward`.

* binary: 1.0 on success (the paper's reward).
* strict: 1.0 on success without a call on any turn whose ground truth makes none
  (`environments.episode.strict_success`, BFCL's irrelevance check).
* progress: passed turns / turns whose ground truth makes a call (docs/method.md); the binary
  reward for an episode without such turns.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from environments.episode import EpisodeResult

REWARD_KINDS = ("binary", "strict", "progress")
# Tags of turns whose ground truth makes no call (the right move is to answer in plain text).
NO_CALL_TAGS = ("correct_abstention", "spurious_tool_call")


def _progress(result: EpisodeResult) -> float:
    graded = [t for t in result.turn_tags if t not in NO_CALL_TAGS]
    return sum(t == "pass" for t in graded) / len(graded) if graded else result.reward


def episode_rewards(results: Sequence[EpisodeResult], kind: str) -> np.ndarray:
    """Returns the rewards float32 [N] of the episodes under reward `kind` (REWARD_KINDS).

    Raises:
      ValueError: an unknown kind.
    """
    if kind == "binary":
        return np.asarray([r.reward for r in results], np.float32)
    if kind == "strict":
        return np.asarray([r.strict_success for r in results], np.float32)
    if kind == "progress":
        return np.asarray([_progress(r) for r in results], np.float32)
    raise ValueError(f"unknown reward kind {kind!r}; use one of {', '.join(REWARD_KINDS)}")
