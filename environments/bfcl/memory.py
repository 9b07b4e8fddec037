"""BFCL v4's memory category, offline: the key-value and recursive-summary backends.

Per scenario (student, customer, finance, healthcare, notetaker), BFCL first plays its
prerequisite conversations in order: long user turns, the backend's tools shown, the backend's
state carried from one conversation to the next. Each question then starts from the state the
last conversation left, asks one thing, and passes when its final answer (the last reply
without a decodable call) contains an acceptable answer (bfcl_eval's `agentic_checker`).

As BFCL's runner for a Qwen function-calling model: the system prompt is the scenario's memory
instruction with the backend's dump (questions add BFCL's answer format), then the tools; a
reply's calls (decoded as the multi-turn environment decodes them, never evaluated) run on the
episode's own backend instance and their results come back as tool messages; a reply without
a call ends the turn; more than MAXIMUM_STEP_LIMIT call replies in one turn end the
conversation. Backends are created per episode from a deep copy of the state they start from.
"""

from __future__ import annotations

import copy
import functools
import importlib
from dataclasses import dataclass

from bfcl_eval.constants.default_prompts import (
    MAXIMUM_STEP_LIMIT,
    MEMORY_AGENT_SETTINGS,
    MEMORY_BACKEND_INSTRUCTION_CORE_ARCHIVAL,
    MEMORY_BACKEND_INSTRUCTION_UNIFIED,
)
from bfcl_eval.constants.executable_backend_config import CLASS_FILE_PATH_MAPPING
from bfcl_eval.eval_checker.agentic_eval.agentic_checker import agentic_checker
from bfcl_eval.utils import load_dataset_entry, load_ground_truth_entry

from environments.executor import Toolbox
from environments.rendering import Message, Renderer
from environments.toolcall import ToolCall, parameter_schemas, parse_reply

CALL_TIME_LIMIT_S = 5.0
PREREQ = "_prereq"  # BFCL's suffix of a prerequisite conversation's category
ACKNOWLEDGEMENT = "Thank you, noted."


@dataclass(frozen=True)
class Backend:
    """One memory backend: its BFCL class and the attributes its snapshots hold (what its
    `_flush_memory_to_local_file` writes and its `_load_scenario` reads back)."""

    class_name: str
    state_fields: tuple[str, ...]

    def create(self, state: dict | None) -> object:
        """A fresh instance starting from a deep copy of `state` (None: empty)."""
        module = importlib.import_module(CLASS_FILE_PATH_MAPPING[self.class_name])
        instance = getattr(module, self.class_name)()
        for name, value in (state or {}).items():
            setattr(instance, name, copy.deepcopy(value))
        return instance

    def state(self, instance: object) -> dict:
        """A deep copy of an instance's snapshot fields."""
        return {name: copy.deepcopy(getattr(instance, name)) for name in self.state_fields}


BACKENDS = {
    "memory_kv": Backend("MemoryAPI_kv", ("core_memory", "archival_memory")),
    "memory_rec_sum": Backend("MemoryAPI_rec_sum", ("memory",)),
}
CATEGORIES = tuple(BACKENDS)
UNAVAILABLE = {
    "memory_vector": "unavailable offline: its backend loads the sentence-transformers "
    "embedding model all-MiniLM-L6-v2 from the Hugging Face Hub (and needs faiss)",
}


@dataclass(frozen=True)
class MemoryTask:
    """A prerequisite conversation or a question of one backend's memory category.

    Attributes:
      task_id: BFCL's id, e.g. "memory_kv_3-customer-3" or "memory_kv_prereq_0-customer-0".
      category: "memory_kv" or "memory_rec_sum"; prerequisite conversations add "_prereq".
      scenario: the scenario whose memory it reads and writes.
      turns: per turn, its user messages.
      instruction: system text of the data (a question's answer format; "" for conversations).
      docs: the backend's function docs, as BFCL shows them.
      answers: acceptable answers of a question; None for a prerequisite conversation.
    """

    task_id: str
    category: str
    scenario: str
    turns: list[list[dict]]
    instruction: str
    docs: list[dict]
    answers: list[str] | None

    @property
    def backend(self) -> Backend:
        """The backend the task runs on."""
        return BACKENDS[self.category.removesuffix(PREREQ)]


def check_category(category: str) -> None:
    """Raises ValueError naming the memory categories when `category` is none of them."""
    if category in UNAVAILABLE:
        raise ValueError(f"{category}: {UNAVAILABLE[category]}")
    if category not in CATEGORIES:
        raise ValueError(f"unknown memory category {category!r}; use one of {CATEGORIES}")


def _task(entry: dict, answers: list[str] | None) -> MemoryTask:
    """A MemoryTask from one of BFCL's processed entries."""
    turns = [[m for m in turn if m["role"] != "system"] for turn in entry["question"]]
    system = [m["content"] for m in entry["question"][0] if m["role"] == "system"]
    category = entry["id"].rsplit("_", 1)[0]
    return MemoryTask(
        entry["id"], category, entry["scenario"], turns, "".join(system), entry["function"], answers
    )


@functools.cache
def _tasks(category: str) -> dict[str, MemoryTask]:
    """A category's conversations and questions by id (conversations first, each scenario's in
    order), as bfcl_eval's dataset loader prepares them."""
    check_category(category)
    entries = load_dataset_entry(category)
    questions = [e for e in entries if PREREQ not in e["id"]]
    answers = [a["ground_truth"] for a in load_ground_truth_entry(category)]
    tasks = [_task(e, None) for e in entries if PREREQ in e["id"]]
    tasks += [_task(e, a) for e, a in zip(questions, answers, strict=True)]
    return {task.task_id: task for task in tasks}


def category_of(task_id: str) -> str:
    """The category of a question or conversation id ("memory_kv_prereq_0-x-0" -> "memory_kv")."""
    category = task_id.rsplit("_", 1)[0].removesuffix(PREREQ)
    if category not in CATEGORIES:
        raise ValueError(f"not a BFCL memory task id: {task_id!r}")
    return category


def load_task(task_id: str) -> MemoryTask:
    """The conversation or question with this id; raises ValueError for an unknown id."""
    task = _tasks(category_of(task_id)).get(task_id)
    if task is None:
        raise ValueError(f"no BFCL memory task with id {task_id!r}")
    return task


def question_ids(category: str) -> list[str]:
    """The ids of a category's questions, in file order."""
    return [i for i, task in _tasks(category).items() if task.answers is not None]


def conversation_ids(category: str, scenario: str) -> list[str]:
    """The ids of a scenario's prerequisite conversations, in the order they are played."""
    tasks = _tasks(category).values()
    return [t.task_id for t in tasks if t.answers is None and t.scenario == scenario]


def system_text(task: MemoryTask, instance: object) -> str:
    """The system text before the tools: the scenario's memory instruction with the backend's
    dump, then the task's own (BFCL's `add_memory_instruction_system_prompt`)."""
    unified = "rec_sum" in task.category
    template = (
        MEMORY_BACKEND_INSTRUCTION_UNIFIED if unified else MEMORY_BACKEND_INSTRUCTION_CORE_ARCHIVAL
    )
    text = template.format(
        scenario_setting=MEMORY_AGENT_SETTINGS[task.scenario],
        memory_content=instance._dump_core_memory_to_context(),
    )
    return f"{text}\n\n{task.instruction}" if task.instruction else text


def calls_of(
    text: str, tool_format: str = "qwen", docs: list[dict] | None = None
) -> list[ToolCall]:
    """The calls of a reply that BFCL's decoder keeps (none: the reply ends the turn);
    `qwen_xml` values are read with the parameter schemas of `docs` (the functions shown)."""
    schemas = parameter_schemas(docs or [])
    return parse_reply(text, tool_format=tool_format, schemas=schemas).official_calls


def final_answer(replies: list[str], tool_format: str = "qwen") -> str | None:
    """The last reply without a decodable call (BFCL's last "unsuccessful decoding"), or None."""
    return next((r for r in reversed(replies) if not calls_of(r, tool_format)), None)


def score_answer(
    task: MemoryTask, replies: list[str], tool_format: str = "qwen"
) -> tuple[bool, str | None]:
    """BFCL's verdict on a question's replies in `tool_format`: (passed, why not)."""
    answer = final_answer(replies, tool_format)
    if answer is None:
        return False, "no final answer: every reply made calls"
    if agentic_checker(answer, task.answers)["valid"]:
        return True, None
    return False, f"none of {task.answers} is in the final answer"


def answer_text(answer: str) -> str:
    """A final answer in the format BFCL's system prompt asks for."""
    return str({"answer": answer, "context": "It is what I remembered."})


def oracle_messages(task: MemoryTask) -> list[str]:
    """The oracle's replies: a question's first acceptable answer; a plain acknowledgement of
    each conversation turn (there is nothing to check there)."""
    if task.answers is None:
        return [ACKNOWLEDGEMENT] * len(task.turns)
    return [answer_text(task.answers[0])]


class MemoryEpisode:
    """One memory conversation or question on its own backend instance (module docstring)."""

    def __init__(self, task: MemoryTask, state: dict | None, renderer: Renderer) -> None:
        self.task = task
        self.renderer = renderer
        self.instance = task.backend.create(state)
        self.toolbox = Toolbox({task.backend.class_name: self.instance})
        self.turn = 0
        self.calls_in_turn = 0
        self.model_calls = 0
        self.failure_reason: str | None = None
        self.replies: list[list[str]] = [[] for _ in task.turns]
        self.transcript: list[Message] = []

    def reset(self) -> list[Message]:
        """The opening: the system prompt (memory instruction, tools) and the first turn."""
        system = self.renderer.system(self.task.docs, system_text(self.task, self.instance))
        opening = [system, *self.renderer.user_turn(self.task.turns[0])]
        self.transcript += opening
        return opening

    def step(self, text: str) -> tuple[list[Message], bool]:
        """Feeds one reply; returns (tool messages or the next turn's messages, done)."""
        self.model_calls += 1
        self.transcript.append({"role": "assistant", "content": text})
        self.replies[self.turn].append(text)
        calls = calls_of(text, self.renderer.tool_format, self.task.docs)
        if not calls:
            return self._next_turn()
        outcomes = [self.toolbox.execute(call, CALL_TIME_LIMIT_S) for call in calls]
        observation = [self.renderer.tool_message(outcome) for outcome in outcomes]
        self.transcript += observation
        self.calls_in_turn += 1
        if self.calls_in_turn > MAXIMUM_STEP_LIMIT:  # BFCL's force-quit
            self.failure_reason = "step_limit"
            return [], True
        return observation, False

    def verdict(self) -> tuple[bool, str | None]:
        """(passed, why not) of a question; (False, None) for a conversation (never scored)."""
        if self.task.answers is None:
            return False, None
        return score_answer(self.task, self.replies[0], self.renderer.tool_format)

    def state(self) -> dict:
        """The backend's state now: what a later conversation or question starts from."""
        return self.task.backend.state(self.instance)

    def _next_turn(self) -> tuple[list[Message], bool]:
        """Ends the turn; returns the next turn's user messages, or ([], True) after the last."""
        self.turn += 1
        self.calls_in_turn = 0
        if self.turn == len(self.task.turns):
            return [], True
        opening = self.renderer.user_turn(self.task.turns[self.turn])
        self.transcript += opening
        return opening, False
