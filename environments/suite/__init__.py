"""The generated tool-use suite: tasks, split, and `score`, with the same interfaces as BFCL."""

from environments.bfcl import score_task
from environments.episode import EpisodeResult
from environments.suite.tasks import (
    CATEGORIES,
    category_of,
    load_task,
    load_tasks,
    make_tasks,
    split_ids,
)

__all__ = [
    "CATEGORIES",
    "category_of",
    "load_task",
    "load_tasks",
    "make_tasks",
    "score",
    "split_ids",
]


def score(task_id: str, assistant_turns: list[list[str]], mode: str = "official") -> EpisodeResult:
    """Scores assistant messages produced elsewhere on one suite task (see bfcl.score).

    Args:
      task_id: a suite id, e.g. "multi_turn_base_eval-0".
      assistant_turns: `assistant_turns[i]` lists the raw assistant messages of user turn i.
      mode: "official" (default) or "training".
    Raises:
      ValueError: unknown task id, or more turns than the task has.
    """
    return score_task(load_task(task_id), assistant_turns, mode)
