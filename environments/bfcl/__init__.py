"""BFCL v3 multi-turn: tasks, split, and `score` (the official verdict plus turn diagnosis)."""

from environments.bfcl.tasks import CATEGORIES, all_task_ids, load_task, split_ids
from environments.episode import Episode, EpisodeConfig, EpisodeResult
from environments.task import ToolTask

__all__ = ["CATEGORIES", "all_task_ids", "load_task", "score", "score_task", "split_ids"]


def score(task_id: str, assistant_turns: list[list[str]], mode: str = "official") -> EpisodeResult:
    """Scores assistant messages produced elsewhere on one BFCL multi-turn task.

    The messages are replayed on fresh tool instances with the official semantics (the turn
    boundaries are the given ones, no call budget applies) and verified turn by turn.

    Args:
      task_id: a BFCL multi-turn id, e.g. "multi_turn_base_0".
      assistant_turns: `assistant_turns[i]` lists the raw assistant message strings produced
        during user turn i, in order. Fewer turns than the task has fail as "incomplete".
      mode: "official" (default; agrees with bfcl_eval's checker) or "training".
    Returns:
      EpisodeResult with `success` (bool), `turn_tags` (list[str], one per task turn),
      `turn_causes` (list[set[str]]), `turn_error_kinds`, `observations` (per turn, the
      messages the environment produced) and the full `transcript`.
    Raises:
      ValueError: unknown task id, or more turns than the task has.
    """
    return score_task(load_task(task_id), assistant_turns, mode)


def score_task(
    task: ToolTask,
    assistant_turns: list[list[str]],
    mode: str = "official",
    instance_rule: str = "instantiated",
) -> EpisodeResult:
    """Scores assistant messages on any ToolTask, as `score` does (shared by task sources);
    instance_rule: how `instance_mismatch` is decided (environments.diagnosis.INSTANCE_RULES).

    Raises:
      ValueError: more turns than the task has.
    """
    if len(assistant_turns) > len(task.turns):
        raise ValueError(
            f"{task.task_id} has {len(task.turns)} user turns, got {len(assistant_turns)} turns"
        )
    episode = Episode(task, EpisodeConfig(mode=mode, instance_rule=instance_rule))
    episode.reset()
    for messages in assistant_turns:
        for text in messages:
            episode.act(text)
        episode.finish_turn()
    return episode.result()
