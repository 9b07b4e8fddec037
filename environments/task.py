"""A multi-turn tool-use task, independent of where it comes from (BFCL, generated suites)."""

from dataclasses import dataclass, field


@dataclass(frozen=True)
class ToolTask:
    """Everything an episode needs to run and verify one task.

    Attributes:
      task_id: unique id, e.g. "multi_turn_base_0".
      category: the task's category, e.g. "base".
      turns: per user turn, the user messages that open it ([] for a turn that only reveals
        held-back functions).
      docs: function docs ({name, description, parameters}) shown from the first turn.
      revealed_docs: turn index -> function docs handed over at the start of that turn.
      ground_truth: per user turn, the ground-truth calls as Python call strings.
      classes: class name -> tool class; the episode creates fresh instances of each.
      initial_config: class name -> scenario passed to the instance's `_load_scenario`.
      long_context: whether scenarios load in long-context mode.
      system_preamble: task text placed before the tools section of the system prompt.
    """

    task_id: str
    category: str
    turns: list[list[dict]]
    docs: list[dict]
    ground_truth: list[list[str]]
    classes: dict[str, type]
    initial_config: dict
    revealed_docs: dict[int, list[dict]] = field(default_factory=dict)
    long_context: bool = False
    system_preamble: str = ""
