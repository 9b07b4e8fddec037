"""Over all 800 BFCL tasks: the plain preset and evaluation render byte-identically to the base
Renderer, and no cue or hint of the full interface reveals a ground-truth argument value."""

import json
import re

import pytest

from configs.base import apply_variant, base_config
from environments.bfcl import all_task_ids, load_task
from environments.executor import CallOutcome, check_arguments
from environments.interface import COMPONENTS, InterfaceRenderer, LearningInterface
from environments.policies import oracle_turns
from environments.rendering import Renderer
from environments.toolcall import ToolCall, parse_python_call, parse_reply
from tests.test_interface import PROFILE, STEP, tag_stats

# Everything on for every tool, error kind and tag.
FULL = InterfaceRenderer({c: "static" for c in COMPONENTS}, {c: () for c in COMPONENTS}, True)


@pytest.fixture(scope="module")
def tasks():
    return [load_task(task_id) for task_id in all_task_ids()]


def leaves(value):
    """The scalar values inside a ground-truth argument."""
    if isinstance(value, dict):
        return [leaf for item in value.values() for leaf in leaves(item)]
    if isinstance(value, list | tuple):
        return [leaf for item in value for leaf in leaves(item)]
    return [value]


def truth_values(task):
    """Every ground-truth argument value of the task, as text."""
    values = set()
    for sources in task.ground_truth:
        for source in sources:
            call = parse_python_call(source)
            for value in leaves([*call.positional, *call.arguments.values()]):
                values.add(str(value))
    return values - {""}


def leaks(added, values, allowed):
    """Values found (as whole tokens) in the added text but not in the allowed text."""
    return {
        v for v in values if v not in allowed and re.search(rf"(?<!\w){re.escape(v)}(?!\w)", added)
    }


def synthetic_failures(task):
    """Error outcomes a policy could provoke on this task, many of them carrying ground truth.

    Argument errors come from the real validator on broken ground-truth calls; the others
    carry ground-truth values in their texts and details (the hint must not repeat them).
    """
    docs = {doc["name"]: doc for docs in [task.docs, *task.revealed_docs.values()] for doc in docs}
    outcomes = []
    for messages in oracle_turns(task):
        for call in parse_reply(messages[0]).calls:
            values = [json.dumps(v) for v in call.arguments.values()] or ["x"]
            for broken in (
                {},
                {**call.arguments, "unexpected_parameter": values[0]},
                {k: 12345 if isinstance(v, str) else "text" for k, v in call.arguments.items()},
            ):
                problem = check_arguments(ToolCall(call.name, broken), docs[call.name])
                if problem:
                    outcomes.append(CallOutcome(None, problem[0], problem[1]))
            argument = next(iter(call.arguments), "x")
            outcomes += [
                CallOutcome(None, "enum_value", {"tool": call.name, "argument": argument,
                                                 "allowed": values}),
                CallOutcome(None, "unknown_tool", {"tool": values[0]}),
                CallOutcome(f'{{"error": "{values[0]} not found"}}', "not_found", {}),
                CallOutcome(f'{{"error": "log in as {values[0]}"}}', "auth_required", {}),
                CallOutcome(f"Error during execution: {values}", "tool_error", {"tool": call.name}),
                CallOutcome(f"{call.name} ran past 5 s", "timeout", {"tool": call.name}),
            ]  # fmt: skip
    return outcomes


def added_strings(plain, cued):
    """The text the interface added to a JSON value (cues only ever add text)."""
    if isinstance(plain, str):
        assert plain in cued
        return [cued.replace(plain, "", 1)]
    if isinstance(plain, dict):
        added = [json.dumps(cued[key]) for key in cued.keys() - plain.keys()]
        return added + [s for key in plain for s in added_strings(plain[key], cued[key])]
    if isinstance(plain, list):
        assert len(plain) == len(cued)
        return [s for p, c in zip(plain, cued) for s in added_strings(p, c)]
    assert plain == cued
    return []


def added_to_system(plain, cued):
    """What the interface added to a system prompt: tool-line additions, then trailing lines."""
    plain_lines, cued_lines = plain.split("\n"), cued.split("\n")
    added = []
    for p, c in zip(plain_lines, cued_lines):
        if p != c:
            added += added_strings(json.loads(p), json.loads(c))
    return added + cued_lines[len(plain_lines) :]


def shown_text(task):
    """What the plain interface and the user show of a task: system prompt, reveals, user text."""
    renderer = Renderer()
    messages = [renderer.system(task.docs, task.system_preamble)]
    messages += [renderer.reveal(docs) for docs in task.revealed_docs.values()]
    messages += [m for turn in task.turns for m in turn]
    return "\n".join(m["content"] for m in messages)


def rendered(renderer, task):
    """The system prompt, reveals and synthetic error messages of a task under `renderer`."""
    shown = [doc["name"] for doc in task.docs]
    messages = [renderer.system(task.docs, task.system_preamble)]
    messages += [renderer.reveal(docs) for docs in task.revealed_docs.values()]
    messages += [renderer.tool_message(o, shown) for o in synthetic_failures(task)]
    return messages + [renderer.unparseable(f"invalid JSON ({task.ground_truth})")]


def test_plain_preset_and_evaluation_render_like_the_base_renderer_for_every_task(tasks):
    plain = LearningInterface(apply_variant(base_config(), "vanilla_grpo").interface)
    trained = LearningInterface(apply_variant(base_config(), "closed_loop").interface)
    for interface in (plain, trained):
        for _ in range(3):
            interface.update(STEP, tag_stats(PROFILE))
    assert trained.state.version > 0 and plain.state.version == 0
    renderers = [plain.renderer(), trained.renderer(evaluation=True)]
    for task in tasks:
        expected = rendered(Renderer(), task)
        for renderer in renderers:
            assert rendered(renderer, task) == expected, task.task_id


def test_no_cue_or_hint_reveals_a_ground_truth_value(tasks):
    checked = 0
    for task in tasks:
        values = truth_values(task)
        plain = rendered(Renderer(), task)
        full = rendered(FULL, task)
        allowed = shown_text(task)
        added = added_to_system(plain[0]["content"], full[0]["content"])
        for p, c in zip(plain[1:], full[1:]):
            if p["role"] == "user":  # a reveal: the tools listing, then BFCL's sentence
                added += added_strings(json.loads(p["content"].split("\n")[0]),
                                       json.loads(c["content"].split("\n")[0]))  # fmt: skip
            else:
                assert c["content"].startswith(p["content"] + "\nHint: ")
                added.append(c["content"][len(p["content"]) :])
        checked += len(added)
        assert not leaks("\n".join(added), values, allowed), task.task_id
    assert checked > 100_000


def test_the_leak_check_catches_a_hint_that_names_a_ground_truth_value(tasks):
    # Ground-truth values absent from the prompt and the user's messages (e.g. ids read from
    # tool results) exist; a hint naming one must be flagged.
    for task in tasks:
        allowed = shown_text(task)
        hidden = sorted(v for v in truth_values(task) if v not in allowed and v.isalnum())
        if hidden:
            break
    assert leaks(f"Hint: try {hidden[0]}.", truth_values(task), allowed) == {hidden[0]}
    assert not leaks("Hint: inspect the state first.", truth_values(task), allowed)
