"""Qwen3.5's chat format (`qwen35`) and tool format (`qwen_xml`): golden token-in / token-out
tests against the chat template itself, and the XML call parser on the template's calls and on
malformed or hostile replies.

The reference is `tokenizer.apply_chat_template` with tests/qwen35_chat_template.jinja, which is
a RECONSTRUCTION of Qwen3.5's chat template from public copies of it, not the official file: no
Qwen3.5 tokenizer package is available offline here, so the official template cannot be checked.
As those copies do, it writes a string argument as it is, a list or dict with `tojson`, and any
other value with the `string` filter (Python's str: `2`, `55.5`, `True`, `None`). The tokenizer
is a tiny byte-level BPE in Qwen's mould (environments/suite/tokenizer.py) with Qwen3.5's special
tokens, built at test time.
"""

import json
import re
import time
from pathlib import Path

import pytest
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, trainers
from tokenizers import pre_tokenizers as pre
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from environments.bfcl import load_task, single_turn
from environments.episode import MODES, Episode, EpisodeConfig
from environments.interface import InterfaceRenderer
from environments.policies import oracle_turns
from environments.rendering import Renderer
from environments.suite.tokenizer import QWEN_SPLIT, TOKENIZER_DIR
from environments.toolcall import (
    QWEN_XML_TOOLS_HEADER,
    XML_CALL_EXPECTED,
    ToolCall,
    function_tool,
    parameter_schemas,
    parse_release_reply,
    parse_reply,
    render_tool_call,
    render_tools_block,
)
from seal_jax.chat import chat_format, detect_chat_format
from tests import hf_models

TEMPLATE = Path(__file__).with_name("qwen35_chat_template.jinja").read_text()
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
ADDED_TOKENS = (
    "<tool_call>",
    "</tool_call>",
    "<think>",
    "</think>",
    "<tool_response>",
    "</tool_response>",
)

# BFCL-style docs (BFCL type names: dict, float); the prompt shows them as JSON Schema tools.
DOCS = [
    {
        "name": "get_weather",
        "description": "Current weather of a city. ünïcode",
        "parameters": {
            "type": "dict",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
            "required": ["city"],
        },
    },
    {
        "name": "book_table",
        "description": "Books a restaurant table.",
        "parameters": {
            "type": "dict",
            "properties": {
                "city": {"type": "string"},
                "zip": {"type": "string"},
                "people": {"type": "integer"},
                "budget": {"type": "float"},
                "vegan": {"type": "boolean"},
                "times": {"type": "array", "items": {"type": "string"}},
                "contact": {"type": "dict"},
                "note": {"type": "string"},
            },
            "required": ["city", "people"],
        },
    },
]
TOOLS = [function_tool(doc) for doc in DOCS]
SCHEMAS = {doc["name"]: doc["parameters"] for doc in DOCS}
PREAMBLE = "You are a travel agent."


def call(name, **arguments):
    return {"type": "function", "function": {"name": name, "arguments": arguments}}


BOOKING = dict(
    city="Paris",
    zip="75001",
    people=2,
    budget=55.5,
    vegan=True,
    times=["19:00", "19:30"],
    contact={"name": "Zoë", "phone": None, "tags": ["vip", {"floor": 1, "quiet": False}]},
    note="\nwindow seat\n< quiet > </parameter-ish\n",
)
CONVERSATION = [
    {"role": "system", "content": PREAMBLE},
    {"role": "user", "content": "Weather in Paris and in Zürich?"},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            call("get_weather", city="Paris", days=2),
            call("get_weather", city="Zürich"),
        ],
    },
    {"role": "tool", "content": json.dumps({"temp_c": 21, "sky": "clear"})},
    {"role": "tool", "content": "Error: city 'Zürich' not found. Try 'Zurich'."},
    {"role": "assistant", "content": "Paris: 21°C and clear. Zürich is unknown to the service."},
    {"role": "user", "content": "Then book a table for 2 in Paris."},
    {"role": "assistant", "content": "Booking now.", "tool_calls": [call("book_table", **BOOKING)]},
    {"role": "tool", "content": json.dumps({"status": "booked", "id": 7})},
    {"role": "assistant", "content": "Done: booking 7."},
]
LAST_QUERY = 6  # the index of the last user message


@pytest.fixture(scope="module")
def tokenizer():
    """A tiny byte-level BPE tokenizer in Qwen's mould with Qwen3.5's special tokens and the
    reconstructed template, trained on the template and the conversation's text."""
    bpe = Tokenizer(models.BPE())
    bpe.normalizer = normalizers.NFC()
    bpe.pre_tokenizer = pre.Sequence(
        [
            pre.Split(Regex(QWEN_SPLIT), behavior="isolated"),
            pre.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=600,
        min_frequency=2,
        initial_alphabet=pre.ByteLevel.alphabet(),
        show_progress=False,
    )
    corpus = [TEMPLATE, json.dumps(TOOLS, ensure_ascii=False), json.dumps(CONVERSATION)]
    bpe.train_from_iterator(corpus, trainer)
    bpe.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    bpe.add_tokens([AddedToken(t, special=False, normalized=False) for t in ADDED_TOKENS])
    return PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        chat_template=TEMPLATE,
        clean_up_tokenization_spaces=False,
    )


def template_ids(tokenizer, messages, **kwargs):
    """The reference: the template's render of messages, tokenized by apply_chat_template."""
    return tokenizer.apply_chat_template(messages, tools=TOOLS, **kwargs)["input_ids"]


def reply_text(fmt, message):
    """What the model writes for an assistant message: the template's own rendering of it as a
    turn after the last user query, between its generation prompt and <|im_end|>."""
    query = [{"role": "user", "content": "."}]
    prompt = fmt.render(query, add_generation_prompt=True)
    text = fmt.render(query + [message])
    assert text.startswith(prompt) and text.endswith("<|im_end|>\n")
    return text[len(prompt) : -len("<|im_end|>\n")]


def with_reasoning(conversation):
    """The conversation with a reasoning text on every assistant message (thinking mode)."""
    return [
        {**m, "reasoning_content": f"Step {i}: think it over."} if m["role"] == "assistant" else m
        for i, m in enumerate(conversation)
    ]


def typed(value):
    """`value` with every leaf tagged by its type (in Python True == 1 and 2 == 2.0)."""
    if isinstance(value, dict):
        return {key: typed(item) for key, item in value.items()}
    if isinstance(value, list):
        return [typed(item) for item in value]
    return type(value).__name__, value


def tool_calls(message):
    return [
        ToolCall(c["function"]["name"], c["function"]["arguments"]) for c in message["tool_calls"]
    ]


# ---- the chat format: prompt, episode and environment ids ----------------------------------


def test_the_format_is_chosen_by_the_chat_template(tokenizer):
    fmt = chat_format(tokenizer)
    assert detect_chat_format(tokenizer) == "qwen35"
    assert fmt.tool_format == "qwen_xml" and fmt.end_of_turn == "<|im_end|>"
    assert fmt.chat_template is None  # the tokenizer's own template
    assert fmt.stop_ids == tuple(tokenizer.convert_tokens_to_ids(["<|im_end|>", "<|endoftext|>"]))
    suite = AutoTokenizer.from_pretrained(TOKENIZER_DIR)  # Qwen2.5's template: JSON calls
    qwen3 = AutoTokenizer.from_pretrained(hf_models.qwen_tokenizer_dir(), local_files_only=True)
    for qwen in (suite, qwen3):
        assert detect_chat_format(qwen) == "qwen" and chat_format(qwen).tool_format == "qwen"
    suite.chat_template = {"default": suite.chat_template, "tool_use": TEMPLATE}  # named ones
    assert detect_chat_format(suite) == "qwen35"


@pytest.mark.parametrize("preamble", ["", PREAMBLE])
def test_prompt_ids_are_the_template_render_for_tools(tokenizer, preamble):
    """The system message the environment writes (tools section, then the task text) is the
    template's own for `tools=`, token for token."""
    fmt = chat_format(tokenizer, enable_thinking=False)
    user = CONVERSATION[1]
    system = Renderer(tool_format="qwen_xml").system(DOCS, preamble)
    expected = template_ids(
        tokenizer,
        [{"role": "system", "content": preamble}, user] if preamble else [user],
        add_generation_prompt=True,
        enable_thinking=False,
    )
    assert fmt.prompt_ids([system, user]) == expected
    text = fmt.render([user], TOOLS)
    block = render_tools_block(TOOLS, tool_format="qwen_xml")
    assert block.startswith(QWEN_XML_TOOLS_HEADER + "\n{")
    assert text.startswith(f"<|im_start|>system\n{block}<|im_end|>\n<|im_start|>user\n")


@pytest.mark.parametrize("thinking", [False, True])
def test_episode_ids_keep_every_turns_generation_prompt(tokenizer, thinking):
    """Prompt ids, the sampled reply ids and the environment ids, turn by turn, against the
    template's render of the whole conversation (tokenized by apply_chat_template).

    The template opens a think block in every generation prompt (`<think>\\n\\n</think>\\n\\n`
    without thinking, `<think>\\n` with it, the model then writing its reasoning and
    `</think>\\n\\n`). Rendering the finished conversation keeps the think block of the assistant
    turns after the last user query (turns 2 and 3, identical to what was sampled) and drops it,
    reasoning included, from the turns before it (turns 0 and 1, answering the first query).
    So the training ids equal the full render with exactly those two think blocks added, and the
    ids the model saw before a turn equal the render of the conversation so far only for the
    turns of the first query (each later turn's history has the earlier turns' blocks).
    """
    fmt = chat_format(tokenizer, enable_thinking=thinking)
    conversation = with_reasoning(CONVERSATION) if thinking else CONVERSATION
    opening = fmt.encode("<think>\n" if thinking else "<think>\n\n</think>\n\n")
    ids = fmt.prompt_ids([Renderer(tool_format="qwen_xml").system(DOCS, PREAMBLE), conversation[1]])
    turns, pending = [], []  # (message index, where the reply starts, its think ids)
    for index, message in enumerate(conversation[2:], start=2):
        if message["role"] != "assistant":
            pending.append({"role": message["role"], "content": message["content"]})
            continue
        if pending:
            ids += fmt.env_ids(pending)
            pending = []
        assert ids[-len(opening) :] == opening
        reply = reply_text(fmt, message)
        cut = reply.index("</think>\n\n") + len("</think>\n\n") if thinking else 0
        sampled = fmt.encode(reply)
        assert sampled == fmt.encode(reply[:cut]) + fmt.encode(reply[cut:])
        turns.append((index, len(ids), len(fmt.encode(reply[:cut]))))
        ids += sampled + [fmt.end_of_turn_id]  # as sampled, closed by <|im_end|>
    kwargs = {"enable_thinking": thinking}
    full = template_ids(tokenizer, conversation, **kwargs)
    newline = fmt.encode("\n")  # the template's "\n" after the last <|im_end|>
    assert ids + newline != full
    stripped = list(ids)
    for index, start, think in reversed(turns):
        if index < LAST_QUERY:
            del stripped[start - len(opening) : start + think]
    assert stripped + newline == full
    for index, start, _ in turns:
        seen = template_ids(tokenizer, conversation[:index], add_generation_prompt=True, **kwargs)
        assert (ids[:start] == seen) == (index < LAST_QUERY)


@pytest.mark.parametrize("thinking", [False, True])
def test_environment_ids_carry_the_template_separators(tokenizer, thinking):
    fmt = chat_format(tokenizer, enable_thinking=thinking)
    prompt = "<|im_start|>assistant\n" + ("<think>\n" if thinking else "<think>\n\n</think>\n\n")
    tools = [{"role": "tool", "content": "a"}, {"role": "tool", "content": " b\n"}]
    assert tokenizer.decode(fmt.env_ids(tools)) == (
        "\n<|im_start|>user\n<tool_response>\na\n</tool_response>\n<tool_response>\nb\n"
        "</tool_response><|im_end|>\n" + prompt
    )
    user = [{"role": "user", "content": "next"}]
    assert fmt.env_ids(user, turn_closed=False) == [fmt.end_of_turn_id] + fmt.env_ids(user)
    assert tokenizer.decode(fmt.env_ids(user)) == "\n<|im_start|>user\nnext<|im_end|>\n" + prompt


# ---- the tool format: the template's calls, read back -----------------------------------------


def test_render_tool_call_writes_the_templates_calls(tokenizer):
    fmt = chat_format(tokenizer, enable_thinking=False)
    for message in CONVERSATION:
        if message.get("tool_calls"):
            blocks = "\n".join(render_tool_call(c, "qwen_xml") for c in tool_calls(message))
            content = message["content"]
            assert reply_text(fmt, message) == (f"{content}\n\n{blocks}" if content else blocks)
    assert render_tool_call(ToolCall("f", {}), "qwen_xml") == (
        "<tool_call>\n<function=f>\n</function>\n</tool_call>"
    )
    with pytest.raises(ValueError, match="qwen_xml"):
        render_tool_call(ToolCall("f", {}), "toolace")


def test_parse_reply_reads_back_the_templates_calls_with_their_types(tokenizer):
    fmt = chat_format(tokenizer, enable_thinking=False)
    checked = 0
    for message in CONVERSATION:
        if message.get("tool_calls"):
            expected = tool_calls(message)
            reply = parse_reply(reply_text(fmt, message), tool_format="qwen_xml", schemas=SCHEMAS)
            assert reply.invalid == [] and reply.calls == reply.official_calls == expected
            assert [typed(c.arguments) for c in reply.calls] == [
                typed(c.arguments) for c in expected
            ]
            checked += 1
    assert checked == 2
    # Without the schemas a value is JSON or a Python constant when it parses as one: the
    # numeric-looking string "75001" becomes a number; every other value reads back the same.
    text = render_tool_call(ToolCall("book_table", BOOKING), "qwen_xml")
    (unschemed,) = parse_reply(text, tool_format="qwen_xml").calls
    assert typed(unschemed.arguments) == typed({**BOOKING, "zip": 75001})


def test_tolerated_forms():
    """Newlines between the tags may be missing or doubled, text may come before the calls,
    BFCL type names and JSON constants are read, and only one newline is stripped per side."""
    text = (
        "I will call both.\n<tool_call><function=book_table><parameter=people>2</parameter>"
        "<parameter=vegan>true</parameter><parameter=budget>\n30\n</parameter>"
        "<parameter=contact>{}</parameter></function></tool_call>\n\n"
        "<tool_call>\n  <function=get_weather>\n\n<parameter=city>\n\nOslo\n\n</parameter>\n"
        "  </function>\n</tool_call>"
    )
    reply = parse_reply(text, tool_format="qwen_xml", schemas=SCHEMAS)
    expected = [
        ToolCall("book_table", {"people": 2, "vegan": True, "budget": 30, "contact": {}}),
        ToolCall("get_weather", {"city": "\nOslo\n"}),
    ]
    assert reply.calls == reply.official_calls == expected and reply.invalid == []
    assert typed(reply.calls[0].arguments)["budget"] == ("int", 30)  # a float schema takes ints
    # An unknown tool or argument reads values without a schema; code stays text.
    code = "__import__('os').system('echo pwned')"
    text = block("rm", x=code)
    assert parse_reply(text, tool_format="qwen_xml", schemas=SCHEMAS).calls == [
        ToolCall("rm", {"x": code})
    ]
    assert parse_reply("No call needed.", tool_format="qwen_xml") == parse_reply(
        "", tool_format="qwen_xml"
    )


def block(name, **values):
    """A `<tool_call>` block with these raw parameter texts."""
    parameters = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in values.items())
    return f"<tool_call>\n<function={name}>\n{parameters}</function>\n</tool_call>"


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ('<tool_call>\n{"name": "get_weather", "arguments": {}}\n</tool_call>', XML_CALL_EXPECTED),
        ("<tool_call>\n<function=get_weather>\n</tool_call>", XML_CALL_EXPECTED),
        ("<function=get_weather>\n</function>", "outside <tool_call>"),
        ("<tool_call>\n<function=get_weather>\n</function>", "not closed with </tool_call>"),
        ("<tool_call>\n<tool_call>\n<function=f>\n</function>\n</tool_call>", "inside another"),
        (
            "<tool_call>\n<function=f>\n</function>\n<function=g>\n</function>\n</tool_call>",
            "one <function=NAME>",
        ),
        (
            "<tool_call>\n<function=f>\n<parameter=a>\n1\n<parameter=b>\n2\n</parameter>\n"
            "</function>\n</tool_call>",
            "<parameter=a> is not closed",
        ),
        (
            "<tool_call>\n<function=f>\n<parameter=a>\n1\n</function>\n</tool_call>",
            "a <parameter=...> is not closed",
        ),
        (
            block("get_weather", city="Oslo").replace("</parameter>\n", "</parameter>\njunk"),
            "unexpected text 'junk'",
        ),
        (block("f", a="1", b="2").replace("<parameter=b>", "<parameter=a>"), "given twice"),
    ],
)
def test_unusable_blocks_get_one_reason_each(text, reason):
    reply = parse_reply(text, tool_format="qwen_xml", schemas=SCHEMAS)
    assert reply.calls == reply.official_calls == []
    assert len(reply.invalid) == 1 and reason in reply.invalid[0], reply.invalid


@pytest.mark.parametrize(
    "tool, argument, text",
    [
        ("get_weather", "days", "two"),
        ("get_weather", "days", "2.5"),
        ("book_table", "vegan", "yes"),
        ("book_table", "budget", '"55"'),
        ("book_table", "times", "[1,"),
        ("book_table", "contact", "[1]"),
        ("book_table", "contact", "__import__('os').system('x')"),
        ("book_table", "times", "[" * 50_000),
        ("book_table", "people", "9" * 5000),
    ],
)
def test_a_value_not_of_its_type_is_kept_as_text(tool, argument, text):
    """As vLLM's qwen3_coder parser: a value that is not of its parameter's type stays the
    text (the environment then answers with a wrong-type error); the call stays usable."""
    reply = parse_reply(block(tool, **{argument: text}), tool_format="qwen_xml", schemas=SCHEMAS)
    assert reply.invalid == [] and reply.calls == reply.official_calls
    assert reply.calls[0].arguments == {argument: text}


def test_none_is_no_value_for_every_type_and_null_a_string_of_a_string_parameter():
    """The template writes Python's None as `None`: no value, for a string parameter too;
    JSON's `null` is no value where the type is not a string, and the text `null` where it is
    (BFCL's data has string arguments "null")."""
    for argument, text, value in (
        ("days", "None", None),
        ("city", "None", None),
        ("days", "null", None),
        ("city", "null", "null"),
    ):
        xml = block("get_weather", **{argument: text})
        reply = parse_reply(xml, tool_format="qwen_xml", schemas=SCHEMAS)
        assert reply.calls[0].arguments == {argument: value}


def test_one_unusable_block_drops_the_message_officially_not_the_other_calls():
    good = render_tool_call(ToolCall("get_weather", {"city": "Oslo"}), "qwen_xml")
    reply = parse_reply(
        good + "\n" + block("get_weather", days="2").replace("</function>", ""),
        tool_format="qwen_xml",
        schemas=SCHEMAS,
    )
    assert reply.calls == [ToolCall("get_weather", {"city": "Oslo"})]
    assert len(reply.invalid) == 1 and reply.official_calls == []
    assert parse_release_reply(good, "qwen_xml", SCHEMAS) == (reply.calls, [])


def test_hostile_replies_are_refused_quickly_with_one_reason():
    """Huge, nested and unclosed input: one reason each, never an exception, and linear time
    (these would take minutes if scanning restarted at every opening tag)."""
    cases = [
        ("<tool_call>" * 200_000, "not closed"),
        ("<tool_call>" * 200_000 + "</tool_call>", "longer than"),
        ("<tool_call>\n" + "<function=f>" * 200_000 + "</tool_call>", "longer than"),
        ("<tool_call>" + "<parameter=a>" * 5_000 + "</tool_call>", XML_CALL_EXPECTED),
        (block("f", a="x" * 200_000), "longer than 100000"),
        ("<function=" * 200_000, "outside <tool_call>"),
        (block("f", a="\x00\ud800") + "<tool_call>", "not closed"),
    ]
    started = time.monotonic()
    for text, reason in cases:
        reply = parse_reply(text, tool_format="qwen_xml", schemas=SCHEMAS)
        assert len(reply.invalid) == 1 and reason in reply.invalid[0], (text[:40], reply.invalid)
        assert reply.official_calls == []
    assert time.monotonic() - started < 30
    assert parse_reply("x" * 2_000_000, tool_format="qwen_xml").invalid == []


# ---- the environment: schemas reach the parser ------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_ground_truth_written_as_xml_calls_passes_every_mode(mode):
    """BFCL's ground truth replayed as qwen_xml calls passes: the episode passes the shown
    tools' schemas to the parser, so values are read with their documented types."""
    task = load_task("multi_turn_base_0")
    episode = Episode(task, EpisodeConfig(mode=mode), Renderer(tool_format="qwen_xml"))
    assert episode.reset()[0]["content"].startswith(QWEN_XML_TOOLS_HEADER)
    for turn in oracle_turns(task):
        for message in turn:
            calls = parse_reply(message).calls  # the oracle writes Qwen's JSON calls
            xml = "\n".join(render_tool_call(c, "qwen_xml") for c in calls)
            episode.step(xml if calls else message)
    result = episode.result()
    assert result.success and set(result.turn_tags) <= {"pass", "correct_abstention"}


@pytest.mark.parametrize("mode", MODES)
def test_a_numeric_looking_string_argument_runs_as_a_string(mode, monkeypatch):
    """`cd(folder="2024")`: with the shown schema (folder: string) the tool gets a string in
    every mode; read without it the value would be the number 2024 (refused as the wrong type in
    training mode, run as a number in the others)."""
    task = load_task("multi_turn_base_0")
    (cd,) = [doc for doc in task.docs if doc["name"] == "cd"]
    assert cd["parameters"]["properties"]["folder"]["type"] == "string"
    episode = Episode(task, EpisodeConfig(mode=mode), Renderer(tool_format="qwen_xml"))
    episode.reset()
    ran, execute = [], episode.model.execute
    monkeypatch.setattr(
        episode.model, "execute", lambda c, limit: ran.append(c) or execute(c, limit)
    )
    episode.act(render_tool_call(ToolCall("cd", {"folder": "2024"}), "qwen_xml"))
    assert [typed(c.arguments) for c in ran] == [{"folder": ("str", "2024")}]


def _string_parameter_with_another_type(task, calls) -> bool:
    """Whether a call gives a string parameter a value that is not a string (BFCL's data has
    such ground truth, e.g. False for a "string" flag): the XML text cannot say which it is."""
    schemas = parameter_schemas(task.docs)
    for call in calls:
        properties = schemas.get(call.name, {}).get("properties", {})
        for argument, value in call.arguments.items():
            kind = properties.get(argument, {}).get("type")
            if kind == "string" and value is not None and not isinstance(value, str):
                return True
    return False


def test_bfcl_single_turn_replies_as_xml_calls_score_as_the_json_ones():
    """Every BFCL single-turn task's oracle reply, rewritten as qwen_xml calls, gets the
    official checker's verdict of the JSON reply, except where a string parameter's value is not
    a string (the only values the XML text cannot carry); the schemas reach the decoder."""
    differ, checked = [], 0
    for category in single_turn.CATEGORIES:
        for task_id in single_turn.task_ids(category):
            task = single_turn.load_task(task_id)
            if task.ground_truth is None:
                continue
            reply = single_turn.oracle_reply(task)
            calls = parse_reply(reply).calls
            xml = "\n".join(render_tool_call(call, "qwen_xml") for call in calls)
            checked += 1
            json_verdict = single_turn.score_reply(task, reply)[0]
            if single_turn.score_reply(task, xml, "qwen_xml")[0] != json_verdict:
                differ.append((task_id, _string_parameter_with_another_type(task, calls)))
    assert checked > 2000
    assert all(explained for _, explained in differ), differ
    assert len(differ) < 0.01 * checked


def test_the_unparseable_hint_describes_the_xml_calls():
    """The error hint for an unusable reply names every tag of a qwen_xml call in the order a
    call written by the template has them (not the JSON format's hint)."""
    modes = {"schema_cues": "off", "affordance_cues": "off", "error_hints": "static"}
    view = InterfaceRenderer({**modes, "guidelines": "off"}, {}, tool_format="qwen_xml")
    hint = view.unparseable("bad")["content"].split("Hint: ", 1)[1]
    call = render_tool_call(ToolCall("get_weather", {"city": "Oslo"}), "qwen_xml")
    tags = [t.split("=")[0] for t in re.findall(r"</?[a-z_]+=?", call)]
    assert [t.split("=")[0] for t in re.findall(r"</?[a-z_]+=?", hint)] == tags
    assert '"name"' not in hint


def test_the_warm_start_oracle_writes_xml_calls_that_solve_the_task(tokenizer):
    """sft.oracle_transcript for a Qwen3.5 chat format: the oracle's calls are qwen_xml blocks,
    the episode (parsing them with the shown tools' schemas) ends in success, and the loss
    covers exactly the replies."""
    from seal_jax import sft

    fmt = chat_format(tokenizer)
    task = load_task("multi_turn_base_0")
    ids, mask = sft.oracle_transcript(task, fmt)
    replies = tokenizer.decode(ids[mask])
    assert "<function=cd>" in replies and '{"name"' not in replies
    (first,) = oracle_turns(task, "qwen_xml")[0][:1]
    assert replies.startswith(first + "<|im_end|>")


def test_the_release_config_shows_json_calls_with_thinking_on(tokenizer):
    """configs/qwen35.py as the release runs Qwen3.5: Qwen's JSON calls shown and parsed
    (model.tool_format=qwen), generation prompts opening <think>; tool_format=auto gives the
    template's XML calls; an unknown tool format is one configuration error."""
    from configs import qwen35
    from seal_jax import config as config_lib
    from seal_jax.chat import run_chat_format

    config = qwen35.get_config()
    fmt = run_chat_format(tokenizer, config)
    assert fmt.tool_format == "qwen"
    prompt = tokenizer.decode(fmt.prompt_ids([{"role": "user", "content": "hi"}]))
    assert prompt.endswith("<|im_start|>assistant\n<think>\n")
    config.model.tool_format = "auto"
    assert run_chat_format(tokenizer, config).tool_format == "qwen_xml"
    config.model.tool_format = "hermes"
    with pytest.raises(config_lib.ConfigError, match="model.tool_format"):
        config_lib.validate(config)
