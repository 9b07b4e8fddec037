"""The failure profile C_t: tag and fine-cause statistics of the training episodes.

One record, kept once per run, that both sides of SEAL's closed loop read: the weighting turns it
into tag utilities (`environments.weighting`), the interface chooses its guidelines from it
(`environments.interface`). Each occurrence (a tag per ground-truth turn, a cause per turn that
shows it) is counted with its episode's reward, in this epoch's window and in all-time totals.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from environments.episode import EpisodeResult


@dataclasses.dataclass
class TagStatistics:
    """Per-label occurrence counts and summed episode rewards: this epoch's window and all time."""

    window_count: dict[str, int] = dataclasses.field(default_factory=dict)
    window_reward_sum: dict[str, float] = dataclasses.field(default_factory=dict)
    total_count: dict[str, int] = dataclasses.field(default_factory=dict)
    total_reward_sum: dict[str, float] = dataclasses.field(default_factory=dict)

    def add_episode(self, tags: Iterable[str], reward: float) -> None:
        """Counts every occurrence in `tags` (repeats included) with the episode's `reward`."""
        for tag in tags:
            for count, reward_sum in (
                (self.window_count, self.window_reward_sum),
                (self.total_count, self.total_reward_sum),
            ):
                count[tag] = count.get(tag, 0) + 1
                reward_sum[tag] = reward_sum.get(tag, 0.0) + float(reward)

    def end_epoch(self) -> None:
        """Empties the window; the all-time totals are kept."""
        self.window_count.clear()
        self.window_reward_sum.clear()

    def summary(self) -> dict[str, tuple[int, float]]:
        """Returns tag -> (count, mean episode reward) over the window, or all time if empty."""
        if self.window_count:
            count, reward_sum = self.window_count, self.window_reward_sum
        else:
            count, reward_sum = self.total_count, self.total_reward_sum
        return {tag: (n, reward_sum[tag] / n) for tag, n in count.items()}

    def to_dict(self) -> dict[str, dict[str, float]]:
        """Returns the statistics as plain JSON-able data."""
        return {field.name: dict(getattr(self, field.name)) for field in dataclasses.fields(self)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Mapping[str, float]]) -> TagStatistics:
        """Rebuilds statistics written by `to_dict`; raises ValueError on missing fields."""
        names = [field.name for field in dataclasses.fields(cls)]
        missing = [name for name in names if name not in data]
        if missing:
            raise ValueError(f"tag statistics are missing the fields {missing}; got {sorted(data)}")
        cast = {name: int if name.endswith("count") else float for name in names}
        return cls(
            **{name: {tag: cast[name](v) for tag, v in data[name].items()} for name in names}
        )


def episode_causes(result: EpisodeResult) -> list[str]:
    """The fine causes of every turn of an episode, in turn order (sorted within a turn)."""
    return [cause for turn in result.turn_causes for cause in sorted(turn)]


@dataclasses.dataclass
class FailureProfile:
    """Tag statistics (`tags`) and fine-cause statistics (`causes`) of the training episodes."""

    tags: TagStatistics = dataclasses.field(default_factory=TagStatistics)
    causes: TagStatistics = dataclasses.field(default_factory=TagStatistics)

    def add(self, results: Sequence[EpisodeResult], rewards: Sequence[float]) -> None:
        """Records a step's diagnosed episodes with the rewards they were trained on."""
        if len(results) != len(rewards):
            raise ValueError(f"{len(results)} episodes but {len(rewards)} rewards")
        for result, reward in zip(results, rewards):
            self.tags.add_episode(result.turn_tags, float(reward))
            self.causes.add_episode(episode_causes(result), float(reward))

    def end_epoch(self) -> None:
        """Starts the next epoch's window (all-time totals are kept)."""
        self.tags.end_epoch()
        self.causes.end_epoch()

    def to_dict(self) -> dict[str, Any]:
        """Returns the profile as plain JSON-able data (for checkpoints)."""
        return {"tags": self.tags.to_dict(), "causes": self.causes.to_dict()}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> FailureProfile:
        """Rebuilds a profile written by `to_dict`; raises ValueError when it is malformed."""
        if not isinstance(data, Mapping) or set(data) != {"tags", "causes"}:
            raise ValueError("a failure profile needs exactly the keys 'tags' and 'causes'")
        return cls(TagStatistics.from_dict(data["tags"]), TagStatistics.from_dict(data["causes"]))
