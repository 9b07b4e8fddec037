"""Schema validation and secure dispatch of tool calls to fresh per-episode tool instances.

Calls reach only public methods (no leading underscore) of the instances handed in; model text
is never evaluated. Each call runs under a time limit (SIGALRM, main thread only: the worker
pool runs episodes on the main thread of its processes and kills a worker that still hangs).
"""

import contextlib
import copy
import inspect
import json
import re
import signal
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from environments.toolcall import ToolCall

_TYPE_CHECKS = {
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "float": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "array": lambda v: isinstance(v, list),
    "tuple": lambda v: isinstance(v, list),
    "dict": lambda v: isinstance(v, dict),
    "object": lambda v: isinstance(v, dict),
}
_NOT_FOUND = re.compile(r"not found|no such|does not exist|invalid .*(id|code|symbol)", re.I)
_AUTH = re.compile(r"log(ged)? ?in|authenticat|access token|token expired", re.I)


@dataclass(frozen=True)
class CallOutcome:
    """What happened to one call.

    `result` is the string BFCL's checker records for the call (the tool's output, or its
    "Error during execution: ..." text), or None when the environment refused to run it.
    `error_kind` is None on success, else one of: unknown_tool, missing_argument,
    unexpected_argument, wrong_type, enum_value, not_found, auth_required, tool_error, timeout.
    `details` holds the facts a renderer needs to explain the error.
    """

    result: str | None
    error_kind: str | None = None
    details: dict[str, Any] = field(default_factory=dict)
    class_name: str | None = None


class CallTimeout(BaseException):
    """Raised inside a tool that ran past its limit (BaseException: tools catch Exception)."""


@contextlib.contextmanager
def time_limit(seconds: float) -> Iterator[None]:
    """Raises CallTimeout in the block after `seconds`; no limit off the main thread."""
    if seconds <= 0 or threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_alarm(signum: int, frame: object) -> None:
        raise CallTimeout

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def make_instances(
    classes: dict[str, type], initial_config: dict, long_context: bool = False
) -> dict[str, object]:
    """Creates fresh tool instances and loads each one's scenario, as BFCL does.

    Args:
      classes: class name -> tool class, in the task's order.
      initial_config: class name -> scenario dict (deep-copied before loading).
      long_context: BFCL's long-context scenario loading (extra files, longer lists).
    """
    instances = {}
    for name, cls in classes.items():
        instance = cls()
        if hasattr(instance, "_load_scenario"):
            config = copy.deepcopy(initial_config.get(name, {}))
            instance._load_scenario(config, long_context=long_context)
        instances[name] = instance
    return instances


def result_to_text(value: object) -> str:
    """Converts a tool's return value to the string BFCL compares (str, JSON dict, or str())."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict):
        try:
            return json.dumps(value)
        except (TypeError, ValueError):
            return str(value)
    return str(value)


def returned_error_kind(value: object) -> str | None:
    """Classifies a tool's own `{"error": ...}` answer; None when the value is no error."""
    if not isinstance(value, dict) or "error" not in value:
        return None
    message = str(value["error"])
    if _AUTH.search(message):
        return "auth_required"
    if _NOT_FOUND.search(message):
        return "not_found"
    return "tool_error"


def _matches_type(value: Any, schema: dict) -> bool:
    """Whether `value` has the schema's type (and, for arrays, its item type)."""
    check = _TYPE_CHECKS.get(schema.get("type", "any"))
    if check is not None and not check(value):
        return False
    items = schema.get("items")
    if isinstance(value, list) and isinstance(items, dict):
        return all(_matches_type(item, items) for item in value)
    return True


def check_arguments(call: ToolCall, doc: dict) -> tuple[str, dict] | None:
    """Validates a call's arguments against its function doc.

    Returns:
      None when valid, else (error_kind, details) for the first problem found: a missing
      required argument, an unexpected one, a wrong type, or a value outside an enum.
    """
    parameters = doc.get("parameters", {})
    properties = parameters.get("properties", {})
    for name in parameters.get("required", []):
        if name not in call.arguments:
            return "missing_argument", {"tool": call.name, "argument": name}
    for name, value in call.arguments.items():
        schema = properties.get(name)
        if schema is None:
            return "unexpected_argument", {"tool": call.name, "argument": name}
        if not _matches_type(value, schema):
            details = {"expected": schema.get("type"), "got": type(value).__name__}
            return "wrong_type", {"tool": call.name, "argument": name, **details}
        if "enum" in schema and value not in schema["enum"]:
            return "enum_value", {"tool": call.name, "argument": name, "allowed": schema["enum"]}
    return None


class Toolbox:
    """The public methods of one episode's tool instances, callable by name.

    Like BFCL, every public method of every instance is reachable (a later class wins a name
    clash); private and dunder names never are.
    """

    def __init__(self, instances: dict[str, object]) -> None:
        self.instances = instances
        self.methods: dict[str, tuple[str, Any]] = {}
        for class_name, instance in instances.items():
            for name, method in inspect.getmembers(instance, predicate=inspect.ismethod):
                if not name.startswith("_"):
                    self.methods[name] = (class_name, method)

    def owner(self, name: str) -> str | None:
        """Returns the class that would run tool `name`, or None if there is none."""
        entry = self.methods.get(name)
        return entry[0] if entry else None

    def execute(self, call: ToolCall, time_limit_s: float) -> CallOutcome:
        """Runs one call on its instance and reports the outcome; never raises for bad calls."""
        if call.name.startswith("_") or call.name not in self.methods:
            result = f"Error during execution: name '{call.name}' is not defined"
            return CallOutcome(result, "unknown_tool", {"tool": call.name})
        class_name, method = self.methods[call.name]
        try:
            with time_limit(time_limit_s):
                value = method(*call.positional, **call.arguments)
        except CallTimeout:
            result = f"Error during execution: {call.name} ran past {time_limit_s} s"
            return CallOutcome(result, "timeout", {"tool": call.name}, class_name)
        except (Exception, SystemExit) as error:  # A tool may raise anything; report it.
            result = f"Error during execution: {error}"
            return CallOutcome(result, "tool_error", {"tool": call.name}, class_name)
        return CallOutcome(result_to_text(value), returned_error_kind(value), {}, class_name)
