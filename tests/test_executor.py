"""Secure dispatch: only public methods of fresh instances run; errors become outcomes."""

import sys
import time

import pytest

from environments.executor import (
    Toolbox,
    check_arguments,
    make_instances,
    result_to_text,
    returned_error_kind,
)
from environments.toolcall import ToolCall

CALLS = []


class Counter:
    """A tiny stateful tool."""

    def __init__(self):
        self.count = 0
        self._secret = "hidden"

    def _load_scenario(self, scenario, long_context=False):
        self.count = scenario.get("count", 0) + (100 if long_context else 0)

    def increment(self, by: int = 1):
        self.count += by
        return {"count": self.count}

    def find(self, key: str):
        return {"error": f"Key {key} not found."}

    def whoami(self):
        return {"error": "No user is currently logged in."}

    def explode(self):
        raise RuntimeError("boom")

    def leave(self):
        sys.exit(3)

    def hang(self):
        while True:
            pass

    def sleepy(self):
        time.sleep(30)

    def _private(self):
        CALLS.append("private")


def toolbox(config=None):
    return Toolbox(make_instances({"Counter": Counter}, config or {}))


def test_public_method_runs_and_result_is_recorded_like_bfcl():
    box = toolbox({"Counter": {"count": 5}})
    outcome = box.execute(ToolCall("increment", {"by": 2}), 1.0)
    assert outcome.result == '{"count": 7}' and outcome.error_kind is None
    assert outcome.class_name == "Counter"
    assert box.instances["Counter"].count == 7


def test_instances_are_fresh_and_scenarios_deep_copied():
    config = {"Counter": {"count": 1}}
    first, second = toolbox(config), toolbox(config)
    first.execute(ToolCall("increment", {}), 1.0)
    assert second.instances["Counter"].count == 1
    assert config == {"Counter": {"count": 1}}
    long = make_instances({"Counter": Counter}, config, long_context=True)
    assert long["Counter"].count == 101


@pytest.mark.parametrize(
    "name",
    ["_private", "__init__", "__class__", "_load_scenario", "__import__", "eval", "os.system"],
)
def test_private_dunder_and_unknown_names_never_run(name):
    CALLS.clear()
    outcome = toolbox().execute(ToolCall(name, {}), 1.0)
    assert outcome.error_kind == "unknown_tool"
    assert outcome.result == f"Error during execution: name '{name}' is not defined"
    assert CALLS == []


def test_raising_and_exiting_tools_become_tool_errors():
    box = toolbox()
    outcome = box.execute(ToolCall("explode", {}), 1.0)
    assert outcome.error_kind == "tool_error"
    assert outcome.result == "Error during execution: boom"
    assert box.execute(ToolCall("leave", {}), 1.0).error_kind == "tool_error"


def test_bad_arguments_raise_inside_and_are_reported():
    outcome = toolbox().execute(ToolCall("increment", {"nope": 1}), 1.0)
    assert outcome.error_kind == "tool_error" and "unexpected keyword" in outcome.result


@pytest.mark.parametrize("name", ["hang", "sleepy"])
def test_hanging_tools_time_out(name):
    start = time.monotonic()
    outcome = toolbox().execute(ToolCall(name, {}), 0.2)
    assert outcome.error_kind == "timeout"
    assert time.monotonic() - start < 5


def test_tool_error_answers_are_classified():
    box = toolbox()
    assert box.execute(ToolCall("find", {"key": "k"}), 1.0).error_kind == "not_found"
    assert box.execute(ToolCall("whoami", {}), 1.0).error_kind == "auth_required"
    assert returned_error_kind({"error": "Invalid fields for update"}) == "tool_error"
    assert returned_error_kind({"result": 1}) is None


def test_results_are_converted_like_bfcl():
    assert result_to_text("a") == "a"
    assert result_to_text({"a": 1}) == '{"a": 1}'
    assert result_to_text({"a": {1, 2}}) == "{'a': {1, 2}}"
    assert result_to_text(None) == "None"


DOC = {
    "name": "book",
    "parameters": {
        "type": "dict",
        "properties": {
            "city": {"type": "string"},
            "nights": {"type": "integer"},
            "price": {"type": "float"},
            "tags": {"type": "array", "items": {"type": "string"}},
            "cls": {"type": "string", "enum": ["economy", "business"]},
        },
        "required": ["city"],
    },
}


@pytest.mark.parametrize(
    ("arguments", "kind"),
    [
        ({"city": "Paris", "nights": 2, "price": 3, "tags": ["a"], "cls": "economy"}, None),
        ({}, "missing_argument"),
        ({"city": "Paris", "pool": True}, "unexpected_argument"),
        ({"city": 5}, "wrong_type"),
        ({"city": "Paris", "nights": True}, "wrong_type"),
        ({"city": "Paris", "nights": 1.5}, "wrong_type"),
        ({"city": "Paris", "tags": ["a", 1]}, "wrong_type"),
        ({"city": "Paris", "cls": "first"}, "enum_value"),
    ],
)
def test_schema_validation(arguments, kind):
    problem = check_arguments(ToolCall("book", arguments), DOC)
    assert (problem[0] if problem else None) == kind
