"""The learning interface: cues, hints and guidelines from constructed diagnoses, the closed loop's
switching, presets, the plain interface at evaluation, state round trip, the pool."""

import json

import pytest

from configs.base import INTERFACE_PRESETS, base_config
from environments.bfcl import evaluate, load_task
from environments.episode import Episode, EpisodeConfig, EpisodeResult
from environments.executor import CallOutcome
from environments.interface import (
    GUIDELINES,
    HINTS,
    INSTRUCTION,
    InterfaceState,
    LearningInterface,
)
from environments.policies import FINAL_ANSWER, NoActionPolicy
from environments.pool import EnvPool, PoolConfig
from environments.profile import FailureProfile, TagStatistics
from environments.rendering import Renderer
from environments.toolcall import QWEN_TOOLS_FOOTER, QWEN_TOOLS_HEADER, ToolCall, render_tool_call

DOCS = [
    {
        "name": "set_mode",
        "description": "Sets the mode.",
        "parameters": {
            "type": "dict",
            "properties": {
                "mode": {"type": "string", "description": "The mode.", "enum": ["fast", "slow"]},
                "level": {"type": "integer", "description": "The level."},
            },
            "required": ["mode"],
        },
    },
    {
        "name": "read_file",
        "description": "Reads a file.",
        "parameters": {
            "type": "dict",
            "properties": {"path": {"type": "string", "description": "The path."}},
            "required": ["path"],
        },
    },
]
AFFORDANCE = (
    "Call this tool whenever the request needs what it does, also as a step before other calls."
)


def interface_config(preset, **overrides):
    config = base_config().interface
    for key, value in {**INTERFACE_PRESETS[preset], **overrides}.items():
        setattr(config, key, value)
    return config


def result(*turns):
    """An EpisodeResult whose turns are dicts of causes, kinds, argument and missing tools."""
    return EpisodeResult(
        "t",
        "c",
        False,
        ["state_mismatch"] * len(turns),
        [set(t.get("causes", ())) for t in turns],
        [list(t.get("kinds", ())) for t in turns],
        turn_argument_tools=[list(t.get("arguments", ())) for t in turns],
        turn_missing_tools=[list(t.get("missing", ())) for t in turns],
    )


def tag_stats(profile):
    """A FailureProfile whose tag window holds tag -> (count, mean reward)."""
    return FailureProfile(
        TagStatistics(
            window_count={tag: n for tag, (n, _) in profile.items()},
            window_reward_sum={tag: n * mean for tag, (n, mean) in profile.items()},
        )
    )


# N = 72 non-excluded occurrences (gt_error is excluded; counted, it would sink instance_mismatch
# below 10 %). Qualifying: state (pressure .139), instance (.083), spurious (.063), response
# (.056, fourth: cut by top 3). empty_turn has too few, pass/correct_abstention no guideline.
PROFILE = {
    "pass": (20, 1.0),
    "state_mismatch": (10, 0.0),
    "spurious_tool_call": (9, 0.5),
    "empty_turn_model_response": (7, 0.0),
    "instance_mismatch": (8, 0.25),
    "response_mismatch": (8, 0.5),
    "correct_abstention": (10, 0.0),
    "gt_error": (20, 0.0),
}

# One step: set_mode breaks its schema in 3 turns (twice in one of them), read_file in 2; three
# turns skip read_file; not_found ends in recovery_failure in 3 turns, missing_argument in 1,
# unknown_tool only in a turn that recovered.
STEP = [
    result(
        {"causes": {"argument_mismatch", "recovery_failure"}, "kinds": ["missing_argument"] * 2,
         "arguments": ["set_mode", "set_mode"]},
        {"causes": {"missing_tool_call", "recovery_failure"}, "kinds": ["not_found"],
         "missing": ["read_file"]},
    ),
    result(
        {"causes": {"argument_mismatch"}, "arguments": ["set_mode", "read_file"]},
        {"causes": {"missing_tool_call", "recovery_failure"}, "kinds": ["not_found"] * 3,
         "missing": ["read_file", "set_mode"]},
    ),
    result(
        {"causes": {"argument_mismatch"}, "arguments": ["set_mode", "read_file"]},
        {"causes": {"missing_tool_call", "recovery_failure"}, "kinds": ["not_found"],
         "missing": ["read_file"]},
        {"causes": set(), "kinds": ["unknown_tool"]},
    ),
]  # fmt: skip


def tools_block(tools):
    return QWEN_TOOLS_HEADER + "".join("\n" + json.dumps(t) for t in tools) + QWEN_TOOLS_FOOTER


def tool(name, description, properties, required):
    parameters = {"type": "object", "properties": properties, "required": required}
    return {
        "type": "function",
        "function": {"name": name, "description": description, "parameters": parameters},
    }


def test_closed_loop_renders_exactly_the_expected_cues_hints_and_guidelines():
    interface = LearningInterface(interface_config("closed_loop", schema_types=True))
    interface.update(STEP, tag_stats(PROFILE))
    assert interface.state.active == {
        "schema_cues": ["set_mode"],
        "affordance_cues": ["read_file"],
        "error_hints": ["not_found"],
        "guidelines": ["state_mismatch", "instance_mismatch", "spurious_tool_call"],
    }
    renderer = interface.renderer()
    set_mode = tool(
        "set_mode",
        "Sets the mode.",
        {
            "mode": {
                "type": "string",
                "description": "[required] The mode. Type: string. Allowed values: fast, slow.",
                "enum": ["fast", "slow"],
            },
            "level": {"type": "integer", "description": "The level. Type: integer."},
        },
        ["mode"],
    )
    read_file = tool(
        "read_file",
        "Reads a file. " + AFFORDANCE,
        {"path": {"type": "string", "description": "The path."}},
        ["path"],
    )
    expected = (
        "Preamble.\n\n"
        + tools_block([set_mode, read_file])
        + "\n\n"
        + INSTRUCTION
        + "\nGuidelines:\n- "
        + GUIDELINES["state_mismatch"]
        + "\n- "
        + GUIDELINES["instance_mismatch"]
        + "\n- "
        + GUIDELINES["spurious_tool_call"]
    )
    assert renderer.system(DOCS, "Preamble.") == {"role": "system", "content": expected}
    # No schema-cued tool in the prompt: no instruction line.
    assert INSTRUCTION not in renderer.system(DOCS[1:])["content"]

    shown = ["set_mode", "read_file"]
    not_found = CallOutcome('{"error": "No such file: a.txt"}', "not_found", {})
    assert renderer.tool_message(not_found, shown)["content"] == (
        '{"error": "No such file: a.txt"}\nHint: ' + HINTS["not_found"]
    )
    plain = Renderer()
    unknown = CallOutcome(None, "unknown_tool", {"tool": "delete"})
    missing = CallOutcome(None, "missing_argument", {"tool": "set_mode", "argument": "mode"})
    for outcome in (unknown, missing, CallOutcome("done", None, {})):
        assert renderer.tool_message(outcome, shown) == plain.tool_message(outcome)
    assert renderer.unparseable("bad") == plain.unparseable("bad")


def test_static_hints_list_the_shown_tools_and_the_call_format():
    renderer = LearningInterface(interface_config("plain", error_hints="static")).renderer()
    unknown = CallOutcome(None, "unknown_tool", {"tool": "delete"})
    assert renderer.tool_message(unknown, ["set_mode", "read_file"])["content"] == (
        "Error: there is no tool named 'delete' among the available tools.\n"
        "Hint: Available tools: set_mode, read_file. If no tool fits the request, answer in "
        "plain text instead."
    )
    assert renderer.unparseable("bad")["content"] == (
        "Error: could not parse the tool call: bad.\nHint: Write each call as <tool_call>, a "
        'newline, {"name": <function-name>, "arguments": <args-json-object>} in valid JSON, a '
        "newline, </tool_call>."
    )


def test_released_preset_is_the_default_and_static():
    released = INTERFACE_PRESETS["released"]
    assert {k: base_config().interface[k] for k in released} == released
    interface = LearningInterface(base_config().interface)
    interface.update(STEP * 5, tag_stats(PROFILE))
    assert interface.state.version == 0 and interface.state.active["guidelines"] == []
    content = interface.renderer().system(DOCS)["content"]
    assert '"description": "[required] The mode. Allowed values: fast, slow."' in content
    assert '"description": "[required] The path."' in content
    assert '"description": "The level."' in content and AFFORDANCE not in content
    assert content.endswith(QWEN_TOOLS_FOOTER + "\n\n" + INSTRUCTION)
    error = CallOutcome(None, "missing_argument", {"tool": "set_mode", "argument": "mode"})
    assert interface.renderer().tool_message(error, ["set_mode"]) == Renderer().tool_message(error)


def test_units_switch_on_and_off_with_hysteresis_and_bump_the_version():
    interface = LearningInterface(interface_config("closed_loop"))  # decay .5, on 3, off 1
    two = result({"causes": {"argument_mismatch"}, "arguments": ["set_mode"]})
    three = result(
        {"causes": {"argument_mismatch"}, "arguments": ["read_file"]},
        {"causes": {"argument_mismatch"}, "arguments": ["read_file"]},
        {"causes": {"argument_mismatch"}, "arguments": ["read_file"]},
    )
    stats = FailureProfile()
    history = []
    for step in [[three, two, two], [two, two], [], [], []]:
        interface.update(step, stats)
        record = interface.log_record()
        history.append((record["version"], record["active"]["schema_cues"]))
    # read_file: e = 3 (on), 1.5, .75 (off). set_mode: e = 2, 3 (on), 1.5, .75 (off).
    assert history == [
        (1, ["read_file"]),
        (2, ["read_file", "set_mode"]),
        (3, ["set_mode"]),
        (4, []),
        (4, []),
    ]
    assert record["step"] == 5 and record["modes"]["schema_cues"] == "adaptive"
    assert record["evidence"]["schema_cues"] == pytest.approx(
        {"read_file": 3 / 16, "set_mode": 3 / 8}
    )
    assert interface.metrics()["interface/version"] == 4.0
    json.dumps(record)


def test_state_round_trips_through_json_and_rejects_malformed_data():
    config = interface_config("closed_loop", schema_types=True)
    interface = LearningInterface(config)
    interface.update(STEP, tag_stats(PROFILE))
    restored = LearningInterface.from_dict(config, json.loads(json.dumps(interface.to_dict())))
    assert restored.to_dict() == interface.to_dict()
    assert restored.renderer() == interface.renderer()
    assert restored.renderer().system(DOCS) == interface.renderer().system(DOCS)
    good = interface.to_dict()
    for broken in (
        {k: v for k, v in good.items() if k != "active"},
        {**good, "version": -1},
        {**good, "step": "3"},
        {**good, "active": {**good["active"], "schema_cues": [3]}},
        {**good, "evidence": {**good["evidence"], "tags": {}}},
        {**good, "evidence": {**good["evidence"], "error_hints": {"not_found": "many"}}},
        [],
    ):
        with pytest.raises(ValueError, match="malformed interface state"):
            InterfaceState.from_dict(broken)


def test_bad_switches_raise_one_clear_error():
    with pytest.raises(ValueError, match="interface switches must be one of"):
        LearningInterface(interface_config("plain", guidelines="dynamic"))
    with pytest.raises(ValueError, match="off_count <= on_count"):
        LearningInterface(interface_config("plain", off_count=5.0))


def call(name, **arguments):
    return render_tool_call(ToolCall(name, arguments))


def test_training_episode_attributes_failures_that_drive_the_closed_loop():
    interface = LearningInterface(interface_config("closed_loop"))

    def play():
        episode = Episode(
            load_task("multi_turn_base_0"), EpisodeConfig(mode="training"), interface.renderer()
        )
        episode.reset()
        (message,), _ = episode.step(call("cd"))
        episode.step(FINAL_ANSWER)
        return message["content"], episode.result()

    hint = "\nHint: Call cd() again with all its required arguments, including 'folder'."
    step = [play() for _ in range(3)]  # One training step: 3 turns fail after a missing argument.
    assert not any(message.endswith(hint) for message, _ in step)
    results = [r for _, r in step]
    interface.update(results, FailureProfile())
    assert play()[0].endswith(hint)
    first = results[0]
    assert first.turn_argument_tools[0] == ["cd"] and first.turn_argument_tools[1:] == [[]] * 3
    assert {"argument_mismatch", "recovery_failure", "missing_tool_call"} <= first.turn_causes[0]
    assert first.turn_missing_tools[0] == ["cd", "mkdir", "mv"]
    assert interface.state.active["schema_cues"] == ["cd"]
    assert interface.state.active["error_hints"] == ["missing_argument"]
    assert {"cd", "mkdir", "mv"} <= set(interface.state.active["affordance_cues"])


def test_pool_workers_render_the_state_and_evaluation_stays_plain():
    interface = LearningInterface(interface_config("closed_loop"))
    interface.state.active["schema_cues"] = ["cd"]
    interface.state.active["error_hints"] = ["missing_argument"]
    task = load_task("multi_turn_base_0")
    config = PoolConfig(num_workers=1, episode=EpisodeConfig(mode="training"))
    with EnvPool(load_task, config) as pool:
        (opening,) = pool.reset([task.task_id], interface.renderer())
        assert opening[0] == interface.renderer().system(task.docs)
        assert opening[0] != Renderer().system(task.docs)
        (observation,), _ = pool.step([call("cd")])
        assert "Hint: Call cd() again" in observation[0]["content"]
        pool.results()
        (evaluated,) = evaluate.run_episodes(NoActionPolicy(), [task.task_id], pool)
    assert evaluated.transcript[0] == Renderer().system(task.docs)
