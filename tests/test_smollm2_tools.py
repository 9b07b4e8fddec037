"""SmolLM2's tool format (`smollm2`): the JSON-list parser (model text only `json.loads`-ed), the
prompt, the learning interface's hint, and BFCL episodes and single-turn scoring through the same
executor, verifier and official checker as the other formats. Token-level tests with the real
tokenizer are in tests/test_smollm2.py."""

import json
import time

import pytest

from environments.bfcl import load_task, single_turn
from environments.episode import MODES, Episode, EpisodeConfig
from environments.interface import INSTRUCTION, SMOLLM2_FORMAT_HINT, InterfaceRenderer
from environments.policies import oracle_turns
from environments.rendering import Renderer
from environments.toolcall import (
    JSON_LIST_EXPECTED,
    SMOLLM2_TOOLS_FOOTER,
    SMOLLM2_TOOLS_HEADER,
    ToolCall,
    parse_release_reply,
    parse_reply,
    render_tool_call,
    render_tools_block,
)

DOCS = [
    {
        "name": "cd",
        "description": "Change directory. ünïcode",
        "parameters": {
            "type": "dict",
            "properties": {"folder": {"type": "string", "description": "Target."}},
            "required": ["folder"],
        },
    },
    {"name": "pwd", "description": "Print the directory.", "parameters": {"type": "dict"}},
]


def smollm2(text):
    return parse_reply(text, tool_format="smollm2")


def calls_list(calls):
    """What SmolLM2 writes for several calls: one JSON list in one block."""
    items = [{"name": c.name, "arguments": c.arguments} for c in calls]
    return f"<tool_call>{json.dumps(items, ensure_ascii=False)}</tool_call>"


# ---- the parser ----------------------------------------------------------------------------


def test_a_block_holds_a_list_of_calls():
    text = (
        'Sure. <tool_call>[{"name": "cd", "arguments": {"folder": "Zürich"}}, '
        '{"name": "pwd", "arguments": "{}"}]</tool_call>'
    )
    reply = smollm2(text)
    calls = [ToolCall("cd", {"folder": "Zürich"}), ToolCall("pwd", {})]
    assert reply.calls == reply.official_calls == calls and reply.invalid == []
    assert smollm2(calls_list(calls)).calls == calls
    spread = "<tool_call>[\n" + json.dumps({"name": "pwd", "arguments": {}}) + "\n]</tool_call>"
    assert smollm2(spread).calls == [ToolCall("pwd", {})]  # the prompt's example layout


@pytest.mark.parametrize("text", ["<tool_call>[]</tool_call>", "The answer is 4.", "[]", ""])
def test_an_empty_list_or_plain_text_is_no_call(text):
    reply = smollm2(text)
    assert reply.calls == reply.invalid == reply.official_calls == []


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ('<tool_call>{"name": "pwd", "arguments": {}}</tool_call>', JSON_LIST_EXPECTED),
        ("<tool_call>[pwd()]</tool_call>", "invalid JSON"),
        ('<tool_call>["pwd"]</tool_call>', 'expected an object {"name"'),
        ('<tool_call>[{"name": "pwd", "arguments": [1]}]</tool_call>', "arguments a JSON object"),
        ('<tool_call>[{"name": "pwd", "arguments": {}}]', "not closed with </tool_call>"),
    ],
)
def test_unusable_blocks_are_reported(text, reason):
    reply = smollm2(text)
    assert reply.calls == reply.official_calls == [] and len(reply.invalid) == 1
    assert reason in reply.invalid[0]


def test_a_bad_item_keeps_the_good_calls_for_training_but_not_for_bfcl():
    reply = smollm2('<tool_call>[{"name": "pwd", "arguments": {}}, {"name": 3}]</tool_call>')
    assert reply.calls == [ToolCall("pwd", {})] and len(reply.invalid) == 1
    assert reply.official_calls == []
    calls, errors = parse_release_reply(
        '<tool_call>[{"name": "pwd", "arguments": {}}, {"name": 3}]</tool_call>', "smollm2"
    )
    assert calls == [ToolCall("pwd", {})] and len(errors) == 1


def test_huge_or_deep_replies_are_refused_quickly():
    started = time.monotonic()
    assert (
        "longer than"
        in parse_reply("<tool_call>[" + "1," * 100_000 + "1]</tool_call>", 1000, "smollm2").invalid[
            0
        ]
    )
    deep = smollm2("<tool_call>" + "[" * 20_000 + "]" * 20_000 + "</tool_call>")
    assert deep.calls == [] and "invalid JSON" in deep.invalid[0]
    assert time.monotonic() - started < 5


def test_render_tool_call_round_trips():
    call = ToolCall("cd", {"folder": "Zürich", "deep": [1, {"a": None}]})
    text = render_tool_call(call, "smollm2")
    assert text == (
        '<tool_call>[{"name": "cd", "arguments": {"folder": "Zürich", "deep": [1, {"a": null}]}}]'
        "</tool_call>"
    )
    assert smollm2(text).official_calls == [call]


# ---- the prompt and the interface -----------------------------------------------------------


def test_the_prompt_lists_the_tools_as_one_json_list():
    tools = [{"name": "cd", "description": "ü"}]
    assert render_tools_block(tools, tool_format="smollm2") == (
        SMOLLM2_TOOLS_HEADER + '[{"name": "cd", "description": "ü"}]' + SMOLLM2_TOOLS_FOOTER
    )
    escaped = render_tools_block(tools, ensure_ascii=True, tool_format="smollm2")
    assert '"\\u00fc"' in escaped
    assert SMOLLM2_TOOLS_HEADER.endswith("<tools>") and SMOLLM2_TOOLS_FOOTER.startswith("</tools>")
    assert SMOLLM2_TOOLS_FOOTER.endswith("]</tool_call>")
    system = Renderer(tool_format="smollm2").system(DOCS, "Be brief.")["content"]
    assert system.startswith("Be brief.\n\n" + SMOLLM2_TOOLS_HEADER + '[{"type": "function"')


def test_interface_cues_and_hints_follow_the_tool_format():
    modes = {"schema_cues": "static", "affordance_cues": "off", "error_hints": "static"}
    view = InterfaceRenderer({**modes, "guidelines": "off"}, {}, tool_format="smollm2")
    content = view.system(DOCS)["content"]
    assert content.endswith("]</tool_call>\n\n" + INSTRUCTION)  # it names <tools></tools>
    assert "[required] Target." in content
    hint = view.unparseable("bad")["content"].split("Hint: ", 1)[1]
    assert hint == SMOLLM2_FORMAT_HINT.format()
    assert hint.startswith("Write all calls as one JSON list") and "<tool_call>[{" in hint


# ---- episodes and BFCL --------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("task_id", ["multi_turn_base_0", "multi_turn_miss_param_0"])
def test_ground_truth_written_by_the_oracle_passes_every_mode(mode, task_id):
    """The oracle writes smollm2 calls; the same executor, verifier and diagnosis pass them."""
    task = load_task(task_id)
    episode = Episode(task, EpisodeConfig(mode=mode), Renderer(tool_format="smollm2"))
    assert SMOLLM2_TOOLS_HEADER in episode.reset()[0]["content"]
    turns = oracle_turns(task, "smollm2")
    assert turns[0][0].startswith("<tool_call>[{")
    for turn in turns:
        for message in turn:
            episode.step(message)
    result = episode.result()
    assert result.success and set(result.turn_tags) <= {"pass", "correct_abstention"}


def test_an_unusable_block_is_answered_in_training_mode_and_rejected_in_release_mode():
    task = load_task("multi_turn_base_0")
    training = Episode(task, EpisodeConfig(mode="training"), Renderer(tool_format="smollm2"))
    training.reset()
    (message,), done = training.step('<tool_call>{"name": "pwd", "arguments": {}}</tool_call>')
    assert message["error_kind"] == "unparseable" and JSON_LIST_EXPECTED in message["content"]
    release = Episode(task, EpisodeConfig(mode="release"), Renderer(tool_format="smollm2"))
    release.reset()
    (message,), _ = release.step("<tool_call>[pwd()]</tool_call>")
    assert message["role"] == "user" and message["error_kind"] == "unparseable"


def test_bfcl_single_turn_replies_as_json_lists_score_as_the_qwen_ones():
    """Every BFCL single-turn oracle reply rewritten as one smollm2 block gets the official
    checker's verdict of the Qwen JSON reply (both carry JSON values: nothing is lost)."""
    checked = passed = 0
    for category in single_turn.CATEGORIES:
        for task_id in single_turn.task_ids(category):
            task = single_turn.load_task(task_id)
            if task.ground_truth is None:
                continue
            reply = single_turn.oracle_reply(task)
            rewritten = calls_list(parse_reply(reply).calls)
            verdict = single_turn.score_reply(task, reply)
            assert single_turn.score_reply(task, rewritten, "smollm2") == verdict, task_id
            checked += 1
            passed += verdict[0]
    assert checked > 2000 and passed > 0.95 * checked
