"""Scripted policies for evaluation before a model exists: the ground-truth oracle and do-nothing.

A policy is started on a batch of tasks and then maps each episode's latest observation to
its next assistant message.
"""

import inspect

from environments.rendering import Message
from environments.task import ToolTask
from environments.toolcall import ToolCall, parse_python_call, render_tool_call

FINAL_ANSWER = "I have completed the request."
# The oracle's answer on a turn whose ground truth makes no call (a value or a function is
# missing): ask instead of acting.
CLARIFY = "I cannot do that yet. Please tell me more."
NO_ACTION = "I cannot help with that."


def _named_arguments(task: ToolTask, call: ToolCall) -> dict:
    """Binds a ground-truth call's positional arguments to parameter names."""
    if not call.positional:
        return dict(call.arguments)
    for cls in task.classes.values():
        method = getattr(cls, call.name, None)
        if method is not None:
            bound = inspect.signature(method).bind(None, *call.positional, **call.arguments)
            return {k: v for k, v in bound.arguments.items() if k != "self"}
    raise ValueError(f"{task.task_id}: ground-truth tool {call.name!r} not found")


def oracle_turns(task: ToolTask, tool_format: str = "qwen") -> list[list[str]]:
    """Returns, per user turn, the assistant messages that replay the ground truth, its calls
    written in `tool_format` (`qwen`, `qwen_xml` or `smollm2`: toolcall.render_tool_call).

    A turn with ground-truth calls gets one message per call (a later call may use an earlier
    one's result, as sending the text of a file just read does), then a final answer; a turn
    without gets only a plain-text request for more (CLARIFY).
    """
    turns = []
    for sources in task.ground_truth:
        calls = [parse_python_call(source) for source in sources]
        calls = [ToolCall(c.name, _named_arguments(task, c)) for c in calls]
        blocks = [render_tool_call(call, tool_format) for call in calls]
        turns.append([*blocks, FINAL_ANSWER] if blocks else [CLARIFY])
    return turns


class OraclePolicy:
    """Replays each task's ground truth, message by message (100% on the official checks)."""

    def __init__(self, tasks: dict[str, ToolTask]) -> None:
        self.tasks = tasks
        self.queues: list[list[str]] = []

    def start(self, task_ids: list[str]) -> None:
        """Prepares one queue of scripted messages per episode."""
        self.queues = [[m for turn in oracle_turns(self.tasks[i]) for m in turn] for i in task_ids]

    def act(self, observations: list[list[Message]]) -> list[str]:
        """Returns the next scripted message of every episode (a final answer once exhausted)."""
        return [queue.pop(0) if queue else FINAL_ANSWER for queue in self.queues]


class NoActionPolicy:
    """Never calls a tool: answers every user turn in plain text."""

    def start(self, task_ids: list[str]) -> None:
        """Nothing to prepare."""

    def act(self, observations: list[list[Message]]) -> list[str]:
        """Returns a plain-text refusal for every episode."""
        return [NO_ACTION for _ in observations]
