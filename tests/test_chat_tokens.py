"""Golden token tests with the real Qwen tokenizer: incremental ids versus the chat template."""

import json

import pytest
from transformers import AutoTokenizer

from seal_jax.chat import ChatFormat
from tests import hf_models

# Qwen2.5-Instruct's chat template (tool calling; append-only: earlier turns never change).
QWEN25_TEMPLATE = (
    "{%- if tools %}{{- '<|im_start|>system\\n' }}{%- if messages[0]['role'] == 'system' %}"
    "{{- messages[0]['content'] }}{%- else %}"
    "{{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}{%- endif %}"
    '{{- "\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.'
    '\\n\\nYou are provided with function signatures within <tools></tools> XML tags:\\n<tools>" }}'
    '{%- for tool in tools %}{{- "\\n" }}{{- tool | tojson }}{%- endfor %}'
    '{{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and '
    'arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": '
    '<function-name>, \\"arguments\\": <args-json-object>}\\n</tool_call><|im_end|>\\n" }}'
    "{%- else %}{%- if messages[0]['role'] == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}{%- else %}"
    "{{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful "
    "assistant.<|im_end|>\\n' }}{%- endif %}{%- endif %}"
    "{%- for message in messages %}"
    '{%- if (message.role == "user") or (message.role == "system" and not loop.first) or '
    '(message.role == "assistant" and not message.tool_calls) %}'
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}"
    "{%- elif message.role == \"assistant\" %}{{- '<|im_start|>' + message.role }}"
    "{%- if message.content %}{{- '\\n' + message.content }}{%- endif %}"
    "{%- for tool_call in message.tool_calls %}{%- if tool_call.function is defined %}"
    "{%- set tool_call = tool_call.function %}{%- endif %}"
    '{{- \'\\n<tool_call>\\n{"name": "\' }}{{- tool_call.name }}'
    '{{- \'", "arguments": \' }}{{- tool_call.arguments | tojson }}'
    "{{- '}\\n</tool_call>' }}{%- endfor %}{{- '<|im_end|>\\n' }}"
    '{%- elif message.role == "tool" %}'
    '{%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}'
    "{{- '<|im_start|>user' }}{%- endif %}{{- '\\n<tool_response>\\n' }}"
    "{{- message.content }}{{- '\\n</tool_response>' }}"
    '{%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}'
    "{{- '<|im_end|>\\n' }}{%- endif %}{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather of a city.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "book_table",
            "description": "Books a restaurant table.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "people": {"type": "integer"}},
                "required": ["city", "people"],
            },
        },
    },
]


def call(name, **arguments):
    return {"type": "function", "function": {"name": name, "arguments": arguments}}


CONVERSATION = [
    {"role": "system", "content": "You are a travel agent."},
    {"role": "user", "content": "Weather in Paris and in Zürich?"},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [call("get_weather", city="Paris"), call("get_weather", city="Zürich")],
    },
    {"role": "tool", "content": json.dumps({"temp_c": 21, "sky": "clear"})},
    {"role": "tool", "content": "Error: city 'Zürich' not found. Try 'Zurich'."},
    {"role": "assistant", "content": "Paris: 21°C and clear. Zürich is unknown to the service."},
    {"role": "user", "content": "Then book a table for 2 in Paris."},
    {
        "role": "assistant",
        "content": "Booking now.",
        "tool_calls": [call("book_table", city="Paris", people=2)],
    },
    {"role": "tool", "content": json.dumps({"status": "booked", "id": 7})},
    {"role": "assistant", "content": "Done: booking 7."},
]


def reply_text(message):
    """What the model emits for an assistant message in Qwen's tool-calling format."""
    calls = [
        "<tool_call>\n"
        + json.dumps(
            {"name": c["function"]["name"], "arguments": c["function"]["arguments"]},
            ensure_ascii=False,
        )
        + "\n</tool_call>"
        for c in message.get("tool_calls", [])
    ]
    return "\n".join(([message["content"]] if message["content"] else []) + calls)


def incremental_ids(fmt):
    """Builds the episode the way the engine does; returns (ids, index where each turn starts)."""
    first = next(i for i, m in enumerate(CONVERSATION) if m["role"] == "assistant")
    ids = fmt.prompt_ids(CONVERSATION[:first], TOOLS)
    turn_starts, pending = [], []
    for message in CONVERSATION[first:]:
        if message["role"] != "assistant":
            pending.append(message)
            continue
        if pending:
            ids += fmt.env_ids(pending)
            pending = []
        turn_starts.append(len(ids))  # the model generates from here, seeing ids[:start]
        ids += fmt.encode(reply_text(message)) + [fmt.end_of_turn_id]  # as sampled
    return ids, turn_starts


@pytest.fixture
def tokenizer():  # fresh per test: some tests replace the chat template
    return AutoTokenizer.from_pretrained(hf_models.qwen_tokenizer_dir(), local_files_only=True)


def test_append_only_template_incremental_ids_equal_the_full_render(tokenizer):
    tokenizer.chat_template = QWEN25_TEMPLATE
    fmt = ChatFormat(tokenizer)
    ids, _ = incremental_ids(fmt)
    full = fmt.encode(fmt.render(CONVERSATION, TOOLS))
    # The render ends with the "\n" that follows the last <|im_end|>; the environment appends it
    # with its next message, so the finished episode stops at <|im_end|>.
    assert ids + fmt.encode("\n") == full


def test_environment_ids_carry_the_template_separators(tokenizer):
    tokenizer.chat_template = QWEN25_TEMPLATE
    fmt = ChatFormat(tokenizer)
    tools = [{"role": "tool", "content": "a"}, {"role": "tool", "content": "b"}]
    assert tokenizer.decode(fmt.env_ids(tools)) == (
        "\n<|im_start|>user\n<tool_response>\na\n</tool_response>\n<tool_response>\nb\n"
        "</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )
    # A reply cut off by max_new_tokens gets its <|im_end|> from the environment.
    user = [{"role": "user", "content": "next"}]
    assert fmt.env_ids(user, turn_closed=False) == [fmt.end_of_turn_id] + fmt.env_ids(user)
    assert tokenizer.decode(fmt.env_ids(user, turn_closed=False)) == (
        "<|im_end|>\n<|im_start|>user\nnext<|im_end|>\n<|im_start|>assistant\n"
    )
    assert fmt.stop_ids == tuple(tokenizer.convert_tokens_to_ids(["<|im_end|>", "<|endoftext|>"]))


def test_qwen3_training_ids_are_the_ids_seen_at_generation(tokenizer):
    """The rule (seal_jax/chat.py): every generation prompt keeps its empty think block in the
    training ids, although re-rendering the conversation drops it from all but the last turn."""
    fmt = ChatFormat(tokenizer, enable_thinking=False)  # the file's own (Qwen3) template
    ids, starts = incremental_ids(fmt)
    think = fmt.encode("<think>\n\n</think>\n\n")
    assistants = [i for i, m in enumerate(CONVERSATION) if m["role"] == "assistant"]
    for k, (start, at) in enumerate(zip(starts, assistants)):
        # What the model saw for turn k: the template's render of the conversation so far, for
        # the first turn; afterwards the history stays as it was when each turn was generated.
        seen = ids[:start]
        assert seen[-len(think) :] == think
        render = fmt.encode(fmt.render(CONVERSATION[:at], TOOLS, add_generation_prompt=True))
        assert (seen == render) == (k == 0)
    # Re-rendering the finished conversation differs from the training ids by exactly the empty
    # think blocks of the earlier turns.
    full = fmt.encode(fmt.render(CONVERSATION, TOOLS))
    assert ids + fmt.encode("\n") != full
    stripped = list(ids)
    for start in reversed(starts[:-1]):
        del stripped[start - len(think) : start]
    assert stripped + fmt.encode("\n") == full


def test_unknown_end_of_turn_token_is_refused(tokenizer):
    with pytest.raises(ValueError, match="no token"):
        ChatFormat(tokenizer, end_of_turn="<|not_a_token|>")
