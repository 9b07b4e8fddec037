"""BFCL's single-turn categories, read from the installed `bfcl-eval` and scored offline by its
own AST checker, as BFCL scores a Qwen function-calling model (its `QwenFCHandler`).

A task is one question and the functions it may call; the model answers once. Its reply's
`<tool_call>` blocks are decoded as the handler's `decode_ast` decodes them (JSON only, never
evaluated) and judged by `ast_checker` (simple, multiple, parallel, parallel_multiple, Java and
JavaScript too), or by BFCL's relevance rule: an irrelevance task passes when the reply holds no
decodable call, a relevance task when it holds one.
"""

from __future__ import annotations

import functools
import importlib
import json
import sys
import types
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from bfcl_eval.constants.category_mapping import SINGLE_TURN_CATEGORY
from bfcl_eval.constants.enums import Language
from bfcl_eval.utils import (
    is_empty_output,
    is_java,
    is_js,
    is_relevance_or_irrelevance,
    load_dataset_entry,
    load_ground_truth_entry,
)

from environments.rendering import Message, Renderer
from environments.toolcall import (
    TOOL_CALL_PATTERN,
    ToolCall,
    parameter_schemas,
    parse_reply,
    render_tool_call,
)

CATEGORIES = tuple(SINGLE_TURN_CATEGORY)
# The registry name the checker is given. Only its `underscore_to_dot` (False for every Qwen FC
# model) is read: dotted function names such as "math.factorial" are compared as they are.
MODEL_NAME = "Qwen_Qwen3-8B-FC"
NO_CALL = "None of the available functions fits this request."
_CHECKER_MODULE = "bfcl_eval.eval_checker.ast_eval.ast_checker"
_REGISTRY_MODULE = "bfcl_eval.constants.model_config"


@dataclass(frozen=True)
class SingleTurnTask:
    """One single-turn question.

    Attributes:
      task_id: BFCL's id, e.g. "simple_python_0" or "live_multiple_3-1-0".
      category: one of CATEGORIES.
      messages: the question's messages (a system message first where it has one).
      docs: the function docs as BFCL shows them (its language hint added; Java and JavaScript
        parameters typed as strings).
      checker_docs: the function docs as the data file has them, which the checker reads.
      ground_truth: [{function: {parameter: [acceptable values, "" when it may be left out]}}];
        None for relevance and irrelevance tasks, which have none.
    """

    task_id: str
    category: str
    messages: list[dict]
    docs: list[dict]
    checker_docs: list[dict]
    ground_truth: list[dict] | None


def check_category(category: str) -> None:
    """Raises ValueError naming the single-turn categories when `category` is none of them."""
    if category not in CATEGORIES:
        raise ValueError(f"unknown single-turn category {category!r}; use one of {CATEGORIES}")


@functools.cache
def _tasks(category: str) -> dict[str, SingleTurnTask]:
    """A category's tasks by id, in file order."""
    check_category(category)
    shown = load_dataset_entry(category, include_prereq=False)
    raw = load_dataset_entry(category, include_prereq=False, include_language_specific_hint=False)
    answers = [None] * len(raw)
    if not is_relevance_or_irrelevance(category):  # aligned by position, as BFCL's runner does
        answers = [entry["ground_truth"] for entry in load_ground_truth_entry(category)]
    return {
        entry["id"]: SingleTurnTask(
            entry["id"], category, entry["question"][0], entry["function"], plain["function"], gt
        )
        for entry, plain, gt in zip(shown, raw, answers, strict=True)
    }


def task_ids(category: str) -> list[str]:
    """The ids of a category's tasks, in file order."""
    return list(_tasks(category))


def load_task(task_id: str) -> SingleTurnTask:
    """The task with this id; raises ValueError for an unknown id."""
    task = _tasks(category_of(task_id)).get(task_id)
    if task is None:
        raise ValueError(f"no BFCL single-turn task with id {task_id!r}")
    return task


def category_of(task_id: str) -> str:
    """The category of a task id ("live_simple_0-0-0" -> "live_simple")."""
    category = task_id.rsplit("_", 1)[0]
    if category not in CATEGORIES:
        raise ValueError(f"not a BFCL single-turn task id: {task_id!r}")
    return category


def decode_calls(
    text: str, tool_format: str = "qwen", docs: list[dict] | None = None
) -> list[dict] | None:
    """The calls of a reply as BFCL decodes them for the AST checker, never evaluated.

    Returns:
      [{name: {argument: value}}]. qwen (BFCL's QwenFCHandler.decode_ast): from the
      `<tool_call>` blocks that are JSON (others are dropped), or None where the handler raises
      (a block is not a {"name", "arguments"} object with an object of arguments). Other
      formats: the calls the multi-turn environment's decoder keeps (toolcall.parse_reply;
      `qwen_xml` values read with the parameter schemas of `docs`, the functions shown).
    """
    if tool_format != "qwen":
        schemas = parameter_schemas(docs or [])
        calls = parse_reply(text, tool_format=tool_format, schemas=schemas).official_calls
        return [{call.name: dict(call.arguments)} for call in calls]
    items = []
    for block in TOOL_CALL_PATTERN.findall(text):
        try:
            items.append(json.loads(block))
        except (ValueError, RecursionError):
            continue
    calls = []
    for item in items:
        if not isinstance(item, dict) or "name" not in item:
            return None
        name, arguments = item["name"], item.get("arguments")
        if not isinstance(arguments, dict) or isinstance(name, list | dict):
            return None
        calls.append({name: dict(arguments)})
    return calls


@functools.cache
def official_ast_checker() -> Callable[..., dict]:
    """bfcl_eval's `ast_checker`. Its module imports BFCL's model registry, which imports every
    vendor's API client (bfcl-eval is installed without its dependencies: Makefile); the checker
    reads only `underscore_to_dot` there, so while it is imported a registry of the one Qwen FC
    entry stands in, and is removed again (a later import gets the real registry)."""
    if _REGISTRY_MODULE in sys.modules:
        return importlib.import_module(_CHECKER_MODULE).ast_checker
    registry = types.ModuleType(_REGISTRY_MODULE)
    entry = types.SimpleNamespace(underscore_to_dot=False)
    registry.MODEL_CONFIG_MAPPING = {MODEL_NAME.replace("_", "/"): entry}
    sys.modules[_REGISTRY_MODULE] = registry
    try:
        return importlib.import_module(_CHECKER_MODULE).ast_checker
    finally:
        del sys.modules[_REGISTRY_MODULE]


def language(category: str) -> Language:
    """The checker's language of a category."""
    if is_java(category):
        return Language.JAVA
    return Language.JAVASCRIPT if is_js(category) else Language.PYTHON


def score_reply(
    task: SingleTurnTask, text: str, tool_format: str = "qwen"
) -> tuple[bool, str | None]:
    """BFCL's verdict on a reply in `tool_format` (toolcall.TOOL_FORMATS): (passed, why not).
    Never raises: a checker that raises (BFCL's runner would stop) fails the task with the
    exception as the reason."""
    calls = decode_calls(text, tool_format, task.docs)
    if task.ground_truth is None:
        called = calls is not None and not is_empty_output(calls)
        if "irrelevance" in task.category:
            return not called, "made a function call" if called else None
        return called, None if called else "made no decodable function call"
    if calls is None:
        return False, "the reply's calls cannot be decoded"
    try:
        verdict = official_ast_checker()(
            task.checker_docs,
            calls,
            task.ground_truth,
            language(task.category),
            task.category,
            MODEL_NAME,
        )
    except Exception as error:  # noqa: BLE001  (a checker crash fails this task only)
        return False, f"the checker raised {type(error).__name__}: {error}"
    if verdict["valid"]:
        return True, None
    return False, json.dumps(verdict["error"], default=str)


def oracle_reply(task: SingleTurnTask) -> str:
    """The reply that makes the ground-truth calls (for each documented argument its first
    acceptable value, Java and JavaScript values as source text); a plain answer where there
    are none. The checker refuses an argument its function does not document."""
    if task.ground_truth is None:
        return NO_CALL
    blocks = []
    for call in task.ground_truth:
        ((name, options),) = call.items()
        doc = next(d for d in task.checker_docs if d["name"] == name)
        schemas = doc["parameters"]["properties"]
        arguments = {
            param: _as_written(_choose(values), schemas[param], task.category)
            for param, values in options.items()
            if param in schemas and _choose(values) is not _OMITTED
        }
        blocks.append(render_tool_call(ToolCall(name, arguments)))
    return "\n".join(blocks)


_OMITTED = object()


def _choose(options: list) -> Any:
    """An argument's first acceptable value. A dict's values, and those of each dict in a list,
    are option lists again (one level down, as the checker reads them). _OMITTED: only ""."""
    value = _first(options)
    if isinstance(value, dict):
        return _first_of_each(value)
    if isinstance(value, list) and value and all(isinstance(item, dict) for item in value):
        return [_first_of_each(item) for item in value]
    return value


def _first(options: list) -> Any:
    """The first option that is not "" (which marks a value that may be left out)."""
    return next((option for option in options if option != ""), _OMITTED)


def _first_of_each(options: dict) -> dict:
    """{key: its first option} for the keys that have one."""
    chosen = {key: _first(values) for key, values in options.items()}
    return {key: value for key, value in chosen.items() if value is not _OMITTED}


def _as_written(value: Any, schema: dict, category: str) -> Any:
    """A value as the model writes it: as it is for Python; for Java and JavaScript (whose
    parameters are shown as strings) the source text BFCL's converters read back."""
    lang = language(category)
    if lang is Language.PYTHON or isinstance(value, str):  # a string, or a variable's name
        return value
    item_type = schema.get("items", {}).get("type")
    if lang is Language.JAVA:
        return _java(value, schema["type"], item_type)
    return _javascript(value, schema["type"])


def _java(value: Any, kind: str, item_type: str | None = None) -> str:
    """Java source for a value of type `kind` (bfcl_eval's java_type_converter reads it)."""
    if isinstance(value, bool):
        return str(value).lower()
    if kind == "long":
        return f"{value}L"
    if kind == "float":
        return f"{value}f"
    if kind == "Array":
        items = ", ".join(_java(v, item_type) if not isinstance(v, str) else v for v in value)
        return f"new {item_type}[]{{{items}}}"
    if kind == "ArrayList":  # String and char elements are read without their quotes
        quote = {"String": '"', "char": "'"}.get(item_type, "")
        items = ", ".join(f"{quote}{v}{quote}" if quote else _java(v, item_type) for v in value)
        return f"new ArrayList<>(Arrays.asList({items}))"
    if kind == "HashMap":
        puts = " ".join(f'put("{k}", {_java_value(v)});' for k, v in value.items())
        return f"new HashMap<String, Object>() {{{{ {puts} }}}}"
    return str(value)


def _java_value(value: Any) -> str:
    """An untyped Java value as bfcl_eval's parse_java_value reads it."""
    if isinstance(value, str):
        return f'"{value}"'
    return _java(value, "")


def _javascript(value: Any, kind: str) -> str:
    """JavaScript source for a value of type `kind` (bfcl_eval's js_type_converter reads it)."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, str):
        return f'"{value}"'
    if kind == "Bigint":
        return f"{value}n"
    if isinstance(value, list):
        return "[" + ", ".join(_javascript(v, "") for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_javascript(v, '')}" for k, v in value.items()) + "}"
    return str(value)


class SingleTurnEpisode:
    """One question: the opening (the question's system text, the tools, its messages), then
    one reply, which is scored (the episode is then done)."""

    def __init__(self, task: SingleTurnTask, renderer: Renderer) -> None:
        self.task = task
        self.renderer = renderer
        self.reply: str | None = None
        self.model_calls = 0
        self.failure_reason: str | None = None
        self.transcript: list[Message] = []

    def reset(self) -> list[Message]:
        """The system prompt and the question's messages."""
        messages = self.task.messages
        has_system = messages[0]["role"] == "system"
        preamble = messages[0]["content"] if has_system else ""
        self.transcript = [self.renderer.system(self.task.docs, preamble)]
        self.transcript += self.renderer.user_turn(messages[has_system:])
        return list(self.transcript)

    def step(self, text: str) -> tuple[list[Message], bool]:
        """Takes the one reply; the episode is then done."""
        self.reply = text
        self.model_calls = 1
        self.transcript.append({"role": "assistant", "content": text})
        return [], True

    def verdict(self) -> tuple[bool, str | None]:
        """(passed, why not), by BFCL's checker."""
        if self.reply is None:
            return False, "no reply"
        return score_reply(self.task, self.reply, self.renderer.tool_format)
