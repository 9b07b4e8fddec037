"""BFCL beyond the multi-turn tasks, offline: the single-turn categories (`single_turn.py`) and
the memory category's key-value and recursive-summary backends (`memory.py`).

`resolve_categories` turns names (categories or the groups in GROUPS) into the categories to
run and those that cannot run here (`memory_vector`, with one line saying why). `ExtraPool`
plays their tasks behind EnvPool's interface (reset, step, stop, results), so the trainer's
rollout driver (`seal_jax.evaluation.evaluate_extra`) and the scripted policies
(`evaluate_extra.py`) drive it alike; `play_categories` runs the memory categories' conversations
scenario by scenario before their questions, carrying each backend's state in the results.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from environments.bfcl import memory, single_turn
from environments.episode import EpisodeResult
from environments.policies import NO_ACTION
from environments.rendering import Message, Renderer

GROUPS = {
    "single_turn": single_turn.CATEGORIES,
    "memory": (*memory.CATEGORIES, *memory.UNAVAILABLE),
    "all": (*single_turn.CATEGORIES, *memory.CATEGORIES, *memory.UNAVAILABLE),
}
Task = single_turn.SingleTurnTask | memory.MemoryTask
Episode = single_turn.SingleTurnEpisode | memory.MemoryEpisode


@dataclass
class ExtraResult(EpisodeResult):
    """The verdict on a single-turn or memory task (no turn tags: there is no multi-turn
    ground truth to diagnose against), plus why the checker refused it and, for a memory
    conversation or question that ran without error, its backend's final state."""

    checker_error: str | None = None
    memory_state: dict | None = None


def resolve_categories(names: Iterable[str]) -> tuple[list[str], dict[str, str]]:
    """The categories named (each entry a category or group, or several joined by commas).

    Returns:
      (categories that run here, in order, each once; {category: why it cannot run here}).
    Raises:
      ValueError: an unknown name; the message lists the valid ones.
    """
    runnable = (*single_turn.CATEGORIES, *memory.CATEGORIES)
    chosen: list[str] = []
    for name in (n.strip() for entry in names for n in str(entry).split(",") if n.strip()):
        if name not in GROUPS and name not in runnable and name not in memory.UNAVAILABLE:
            valid = ", ".join([*GROUPS, *runnable, *memory.UNAVAILABLE])
            raise ValueError(f"unknown BFCL category {name!r}; use any of: {valid}")
        chosen += GROUPS.get(name, (name,))
    chosen = list(dict.fromkeys(chosen))
    unavailable = {c: memory.UNAVAILABLE[c] for c in chosen if c in memory.UNAVAILABLE}
    return [c for c in chosen if c not in unavailable], unavailable


def load_task(task_id: str) -> Task:
    """The single-turn or memory task with this id; ValueError for an unknown id."""
    if task_id.startswith("memory_"):
        return memory.load_task(task_id)
    return single_turn.load_task(task_id)


def scored_ids(category: str, limit: int = 0) -> list[str]:
    """The ids of a category's scored tasks (its questions), the first `limit` (0: all)."""
    if category in memory.CATEGORIES:
        return memory.question_ids(category)[: limit or None]
    return single_turn.task_ids(category)[: limit or None]


class ExtraPool:
    """Single-turn and memory episodes, in this process, behind EnvPool's interface.

    The tasks call no code but the memory backends (pure Python), so no worker processes are
    needed. `states` maps (category, scenario) to the memory state a scenario's next episode
    starts from (`play_categories` sets it). An episode that raises ends at once as a failure,
    the error in its `failure_reason`; the others go on.
    """

    def __init__(self) -> None:
        self.states: dict[tuple[str, str], dict] = {}
        self._episodes: list[Episode] = []
        self._errors: dict[int, str] = {}
        self._dones = np.zeros(0, bool)

    def reset(self, task_ids: list[str], renderer: Renderer | None = None) -> list[list[Message]]:
        """Starts one episode per task id; returns each one's opening ([] for one that failed).

        Raises:
          ValueError: an unknown task id.
        """
        renderer = renderer or Renderer()
        self._episodes = [self._episode(load_task(i), renderer) for i in task_ids]
        self._errors = {}
        self._dones = np.zeros(len(task_ids), bool)
        return [self._guard(b, episode.reset) or [] for b, episode in enumerate(self._episodes)]

    def step(self, texts: list[str | None]) -> tuple[list[list[Message]], np.ndarray]:
        """Feeds one reply per episode (ignored once it is done); returns (observations, dones)."""
        if len(texts) != len(self._episodes):
            raise ValueError(f"expected {len(self._episodes)} messages, got {len(texts)}")
        observations: list[list[Message]] = [[] for _ in texts]
        for b, text in enumerate(texts):
            if self._dones[b]:
                continue
            if not isinstance(text, str):
                raise ValueError(f"episode {b} is not done and needs a message (str)")
            reply = self._guard(b, self._episodes[b].step, text)
            if reply is not None:
                observations[b], self._dones[b] = reply
        return observations, self._dones.copy()

    def stop(self, episodes: list[int]) -> None:
        """Ends these episodes as they stand."""
        self._dones[list(episodes)] = True

    def results(self) -> list[ExtraResult]:
        """The verdict of every episode of the batch, in order."""
        return [self._result(b, episode) for b, episode in enumerate(self._episodes)]

    def _episode(self, task: Task, renderer: Renderer) -> Episode:
        """A fresh episode of `task` (a memory one from its scenario's current state)."""
        if isinstance(task, memory.MemoryTask):
            state = self.states.get((memory.category_of(task.task_id), task.scenario))
            return memory.MemoryEpisode(task, state, renderer)
        return single_turn.SingleTurnEpisode(task, renderer)

    def _guard(self, b: int, method: Callable, *args: object) -> object:
        """Calls an episode's method; an exception ends the episode (recorded), returns None."""
        try:
            return method(*args)
        except Exception as error:  # noqa: BLE001  (one bad task must not stop the rest)
            self._errors[b] = f"{type(error).__name__}: {error}"
            self._dones[b] = True
            return None

    def _result(self, b: int, episode: Episode) -> ExtraResult:
        """One episode's verdict."""
        verdict = None if b in self._errors else self._guard(b, episode.verdict)
        passed, why = verdict or (False, None)
        error = self._errors.get(b)
        state = None
        if isinstance(episode, memory.MemoryEpisode) and error is None:
            state = episode.state()
        return ExtraResult(
            task_id=episode.task.task_id,
            category=episode.task.category,
            success=passed,
            turn_tags=[],
            turn_causes=[],
            turn_error_kinds=[],
            failure_reason=f"error: {error}" if error else episode.failure_reason,
            model_calls=episode.model_calls,
            transcript=episode.transcript,
            checker_error=why,
            memory_state=state,
        )


Play = Callable[[ExtraPool, list[str]], list[EpisodeResult]]


def play_categories(
    categories: Sequence[str], play: Play, pool: ExtraPool, limit: int = 0
) -> list[EpisodeResult]:
    """Plays the scored tasks of each category (the first `limit` of each; 0: all) with
    `play(pool, task_ids) -> results`; for a memory category, first the prerequisite
    conversations of the scenarios its questions need, one per scenario at a time, each
    starting from the state the last one left (an episode that failed with an error leaves
    the state as it was, as BFCL's runner keeps the last snapshot)."""
    results: list[EpisodeResult] = []
    for category in categories:
        ids = scored_ids(category, limit)
        if category in memory.CATEGORIES:
            results += _play_conversations(category, ids, play, pool)
        results += play(pool, ids)
    return results


def _play_conversations(
    category: str, question_ids: list[str], play: Play, pool: ExtraPool
) -> list[EpisodeResult]:
    """The prerequisite conversations of the questions' scenarios, in rounds."""
    scenarios = dict.fromkeys(memory.load_task(i).scenario for i in question_ids)
    chains = [memory.conversation_ids(category, s) for s in scenarios]
    results: list[EpisodeResult] = []
    for round_ids in itertools.zip_longest(*chains):
        played = play(pool, [i for i in round_ids if i is not None])
        for result in played:
            state = getattr(result, "memory_state", None)
            if state is not None:
                pool.states[(category, memory.load_task(result.task_id).scenario)] = state
        results += played
    return results


def summarize(
    results: Sequence[EpisodeResult], categories: Sequence[str], unavailable: dict[str, str]
) -> dict:
    """Accuracy per category (of its scored tasks), their mean, task and error counts, and the
    categories that could not run here with the reason."""
    accuracy, counts = {}, {}
    for category in categories:
        group = [r.success for r in results if r.category == category]
        if group:
            accuracy[category], counts[category] = float(np.mean(group)), len(group)
    errors = sum(bool(r.failure_reason and r.failure_reason.startswith("error:")) for r in results)
    return {
        "accuracy": accuracy,
        "mean": float(np.mean(list(accuracy.values()))) if accuracy else 0.0,
        "num_tasks": counts,
        "num_errors": errors,
        "unavailable": dict(unavailable),
    }


def transcript_record(result: EpisodeResult) -> dict:
    """One line of transcripts.jsonl ("scored" is false for a memory conversation)."""
    return {
        "id": result.task_id,
        "category": result.category,
        "scored": not result.category.endswith(memory.PREREQ),
        "success": result.success,
        "checker_error": getattr(result, "checker_error", None),
        "failure_reason": result.failure_reason,
        "model_calls": result.model_calls,
        "transcript": result.transcript,
    }


def write_report(workdir: str | Path, results: Sequence[EpisodeResult], metrics: dict) -> None:
    """Writes metrics.json and transcripts.jsonl (one line per episode) into workdir."""
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "metrics.json").write_text(json.dumps(metrics, indent=2))
    with (workdir / "transcripts.jsonl").open("w") as file:
        for result in results:
            file.write(json.dumps(transcript_record(result), ensure_ascii=False) + "\n")


def oracle_messages(task_id: str) -> list[str]:
    """The oracle's replies to a task, in order (single_turn.oracle_reply,
    memory.oracle_messages)."""
    task = load_task(task_id)
    if isinstance(task, memory.MemoryTask):
        return memory.oracle_messages(task)
    return [single_turn.oracle_reply(task)]


class ScriptedPolicy:
    """Replays `script(task_id)` message by message, then answers `fallback`."""

    def __init__(self, script: Callable[[str], list[str]], fallback: str = NO_ACTION) -> None:
        self.script = script
        self.fallback = fallback
        self.queues: list[list[str]] = []

    def start(self, task_ids: list[str]) -> None:
        """Prepares one queue of scripted messages per episode."""
        self.queues = [list(self.script(task_id)) for task_id in task_ids]

    def act(self, observations: list[list[Message]]) -> list[str]:
        """The next scripted message of every episode."""
        del observations
        return [queue.pop(0) if queue else self.fallback for queue in self.queues]
