"""ToolACE's tool format and the Llama 3.1 chat format: the Python-call parser (never evaluates
model text), the prompt, BFCL episodes through the same executor, verifier and diagnosis, and
token-in / token-out golden tests with the real Llama 3 tokenizer."""

import dataclasses
import json

import pytest
from transformers import AutoTokenizer

import environments
from environments.bfcl import load_task
from environments.episode import MODES, Episode, EpisodeConfig
from environments.interface import RELEASE_INSTRUCTION, TOOLACE_FORMAT_HINT, InterfaceRenderer
from environments.policies import oracle_turns
from environments.rendering import Renderer
from environments.toolcall import (
    TOOLACE_TOOLS_HEADER,
    ToolCall,
    parse_python_call,
    parse_python_calls,
    parse_release_reply,
    parse_reply,
)
from seal_jax.chat import chat_format, detect_chat_format
from tests import hf_models

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
    {"name": "pwd", "description": "Print the directory.", "parameters": {"type": "dict"}},
]


def python_list(calls):
    """The call list ToolACE writes for `calls` (keyword arguments, Python literals)."""
    rendered = [
        f"{c.name}({', '.join(f'{k}={v!r}' for k, v in c.arguments.items())})" for c in calls
    ]
    return "[" + ", ".join(rendered) + "]"


# ---- the parser ---------------------------------------------------------------------------


def test_parses_a_call_list_with_every_literal_kind():
    text = '[cd(folder="x"), add(a=-1, b=2.5, c=True, d=None, e=[1, (2, 3)], f={"k": "v"}), pwd()]'
    reply = parse_python_calls(text)
    assert (
        reply.calls
        == reply.official_calls
        == [
            ToolCall("cd", {"folder": "x"}),
            ToolCall(
                "add", {"a": -1, "b": 2.5, "c": True, "d": None, "e": [1, (2, 3)], "f": {"k": "v"}}
            ),
            ToolCall("pwd", {}),
        ]
    )
    assert reply.invalid == []


def test_a_bare_call_is_a_list_of_one_and_text_around_a_list_is_allowed():
    assert parse_python_calls("cd(folder='x')\n").official_calls == [
        ToolCall("cd", {"folder": "x"})
    ]
    # An apostrophe in the prose does not hide the list; BFCL decodes only a clean list.
    reply = parse_python_calls("I don't know yet, so: [cd(folder='x')] and then we see.")
    assert reply.calls == [ToolCall("cd", {"folder": "x"})] and reply.official_calls == []


@pytest.mark.parametrize("text", ["The directory is empty.", "[]", "Files: [a.txt, b.txt]", ""])
def test_text_without_a_call_list_is_no_call(text):
    reply = parse_python_calls(text)
    assert reply.calls == [] and reply.invalid == []


@pytest.mark.parametrize(
    "text, reason",
    [
        ("[cd(folder=x)]", "must be a literal"),
        ("[cd(folder=true)]", "must be a literal"),
        ("[cd('x')]", "not by position"),
        ("[cd(**{'folder': 'x'})]", "**kwargs"),
        ("[cd(folder=1 + 2)]", "must be a literal"),
        ("[cd(folder=f'{x}')]", "must be a literal"),
        ("[cd(folder=[i for i in range(3)])]", "must be a literal"),
        ("[cd(folder={[1]: 2})]", "must be a literal"),
        ("[cd(folder=b'x')]", "must be a literal"),
        ("[os.system('true')]", "name a function directly"),
        ("[cd(folder='x')(1)]", "name a function directly"),
        ("[cd(folder='x'), 5]", "an item is not a call"),
        ("[cd(folder='x'))]", "invalid Python syntax"),
        ("[cd(folder='x', folder='y')]", "given twice"),
        ("[cd(folder='x')", "expected one Python list"),
        ('{"name": "cd", "arguments": {"folder": "x"}}', "expected one Python list"),
        ('<tool_call>\n{"name": "cd", "arguments": {}}\n</tool_call>', "not <tool_call> tags"),
        ("[cd(n=" + "9" * 5000 + ")]", "invalid Python syntax"),  # Python's int-parsing limit
        ("[cd(n=" + "[" * 20_000 + "]" * 20_000 + ")]", "invalid Python syntax"),  # depth
    ],
)
def test_anything_but_keyword_literals_is_unparseable(text, reason):
    reply = parse_python_calls(text)
    assert reply.official_calls == [] and any(reason in r for r in reply.invalid), reply.invalid
    assert reply.calls == ([ToolCall("cd", {"folder": "x"})] if ", 5]" in text else [])


def test_model_text_is_never_evaluated(monkeypatch):
    touched = []
    monkeypatch.setattr(environments, "touched", touched, raising=False)
    code = "__import__('environments').touched.append(1)"
    for text in (f"[cd(folder={code})]", f"[{code}]", f"[cd(folder='{code}')]"):
        parse_python_calls(text)
    assert touched == []
    assert parse_python_calls(f'[cd(folder="{code}")]').calls == [ToolCall("cd", {"folder": code})]


def test_huge_lists_are_refused_not_parsed():
    reply = parse_python_calls("[cd(folder='" + "x" * 200 + "')]", max_chars=100)
    assert reply.calls == [] and "longer than 100" in reply.invalid[0]


def test_the_format_switch_of_the_shared_parsers():
    text = "[cd(folder='x'), pwd(n=x)]"
    assert parse_reply(text, tool_format="toolace") == parse_python_calls(text)
    calls, errors = parse_release_reply(text, tool_format="toolace")
    assert calls == [ToolCall("cd", {"folder": "x"})] and len(errors) == 1
    assert parse_reply(text).calls == []  # Qwen's parser sees no <tool_call> block
    with pytest.raises(ValueError, match="tool_format"):
        parse_reply(text, tool_format="hermes")


def test_every_bfcl_ground_truth_turn_parses_back_as_a_call_list():
    """The release split's ground truths, written as ToolACE lists, parse to the same calls."""
    checked = 0
    for task_id in ("multi_turn_base_0", "multi_turn_long_context_3", "multi_turn_miss_param_5"):
        for sources in load_task(task_id).ground_truth:
            calls = [parse_python_call(source) for source in sources]
            if calls and not any(c.positional for c in calls):
                assert parse_python_calls(python_list(calls)).official_calls == calls
                checked += 1
    assert checked >= 6


# ---- the prompt and the environment ---------------------------------------------------------


def test_system_prompt_is_the_release_toolace_prompt():
    """BFCL's prompt-mode system prompt, the docs as one JSON list indented by 4 under
    `arguments` (without `response`), non-ASCII kept; the same for both prompt styles' docs."""
    entries = [
        {"name": d["name"], "description": d["description"], "arguments": d["parameters"]}
        for d in DOCS
    ]
    expected = TOOLACE_TOOLS_HEADER + json.dumps(entries, ensure_ascii=False, indent=4) + "\n"
    release = Renderer(prompt_style="release", tool_format="toolace")
    assert release.system(DOCS)["content"] == expected
    assert "ünïcode" in expected and '"response"' not in expected
    assert release.system(DOCS, "Be brief.")["content"] == "Be brief.\n\n" + expected
    plain = Renderer(tool_format="toolace").system(DOCS)["content"]  # JSON Schema type names
    assert plain == expected.replace('"type": "dict"', '"type": "object"')
    with pytest.raises(ValueError, match="tool_format"):
        Renderer(tool_format="hermes")


def test_interface_cues_and_hints_follow_the_tool_format():
    modes = {"schema_cues": "static", "affordance_cues": "off", "error_hints": "static"}
    view = InterfaceRenderer({**modes, "guidelines": "off"}, {}, tool_format="toolace")
    content = view.system(DOCS)["content"]
    assert content.endswith("\n\n" + RELEASE_INSTRUCTION) and "<tools>" not in content
    assert "Target. [required]" not in content and "[required] Target." in content
    assert view.unparseable("bad")["content"].endswith("Hint: " + TOOLACE_FORMAT_HINT)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(
    "task_id", ["multi_turn_base_0", "multi_turn_miss_func_0", "multi_turn_long_context_0"]
)
def test_ground_truth_written_as_toolace_lists_passes_every_mode(mode, task_id):
    """The executor, verifier and diagnosis are the Qwen format's: replaying the ground truth
    as ToolACE call lists passes every turn, and a non-literal call is answered, not run."""
    task = load_task(task_id)
    episode = Episode(task, EpisodeConfig(mode=mode), Renderer(tool_format="toolace"))
    assert episode.reset()[0]["content"].startswith(TOOLACE_TOOLS_HEADER)
    for turn in oracle_turns(task):
        for message in turn:
            calls = parse_reply(message).calls
            episode.step(python_list(calls) if calls else message)
    result = episode.result()
    assert result.success and set(result.turn_tags) <= {"pass", "correct_abstention"}


def test_non_literal_call_is_answered_as_unparseable_in_training_mode():
    episode = Episode(
        load_task("multi_turn_base_0"),
        EpisodeConfig(mode="training"),
        Renderer(tool_format="toolace"),
    )
    episode.reset()
    (message,), done = episode.step("[cd(folder=document)]")
    assert message["error_kind"] == "unparseable" and "literal" in message["content"] and not done
    assert episode.model.instances["GorillaFileSystem"]._current_dir.name == "workspace"


# ---- token in, token out with the real Llama 3 tokenizer ------------------------------------


@pytest.fixture
def llama_tokenizer():
    return AutoTokenizer.from_pretrained(hf_models.llama_tokenizer_dir(), local_files_only=True)


SYSTEM = Renderer(tool_format="toolace").system(DOCS)["content"]
CONVERSATION = [
    {"role": "system", "content": SYSTEM},
    {"role": "user", "content": "Go to Zürich's folder, then tell me where I am."},
    {"role": "assistant", "content": "[cd(folder='Zürich'), pwd()]"},
    {"role": "tool", "content": json.dumps({"current_working_directory": "Zürich"})},
    {"role": "tool", "content": "Error: pwd() failed.\nHint: try again"},
    {"role": "assistant", "content": "You are in Zürich; pwd failed."},
    {"role": "user", "content": "Try pwd again."},
    {"role": "assistant", "content": "[pwd()]"},
    {"role": "tool", "content": '{"current_working_directory": "/Zürich"}'},
    {"role": "assistant", "content": "You are in /Zürich."},
]


def incremental_ids(fmt, conversation=CONVERSATION):
    """The episode as the engine builds it; returns (ids, index where each turn starts)."""
    ids = fmt.prompt_ids(conversation[:2])
    starts, pending = [], []
    for message in conversation[2:]:
        if message["role"] != "assistant":
            pending.append(message)
            continue
        if pending:
            ids += fmt.env_ids(pending)
            pending = []
        starts.append(len(ids))
        ids += fmt.encode(message["content"]) + [fmt.end_of_turn_id]  # as sampled
    return ids, starts


def test_chat_format_is_chosen_by_the_tokenizer(llama_tokenizer):
    assert detect_chat_format(llama_tokenizer) == "llama3"
    qwen = AutoTokenizer.from_pretrained(hf_models.qwen_tokenizer_dir(), local_files_only=True)
    assert detect_chat_format(qwen) == "qwen" and chat_format(qwen).tool_format == "qwen"
    fmt = chat_format(llama_tokenizer)
    assert fmt.tool_format == "toolace" and fmt.end_of_turn == "<|eot_id|>"
    eot, eom, end = llama_tokenizer.convert_tokens_to_ids(
        ["<|eot_id|>", "<|eom_id|>", "<|end_of_text|>"]
    )
    assert fmt.stop_ids == (eot, eom, end) and fmt.end_of_turn_ids == (eot, eom)
    with pytest.raises(ValueError, match="no token '<\\|im_end\\|>'"):
        chat_format(llama_tokenizer, "qwen")
    with pytest.raises(ValueError, match="must be one of"):
        chat_format(llama_tokenizer, "hermes")


def test_incremental_ids_equal_the_full_render_and_never_change(llama_tokenizer):
    """The template is append-only: every turn's prompt is the render of the conversation so
    far, and the finished episode is the render of the whole conversation."""
    fmt = chat_format(llama_tokenizer)
    ids, starts = incremental_ids(fmt)
    assert ids == fmt.encode(fmt.render(CONVERSATION))
    assert ids[0] == llama_tokenizer.bos_token_id and ids.count(llama_tokenizer.bos_token_id) == 1
    assistants = [i for i, m in enumerate(CONVERSATION) if m["role"] == "assistant"]
    for start, at in zip(starts, assistants, strict=True):
        render = fmt.encode(fmt.render(CONVERSATION[:at], add_generation_prompt=True))
        assert ids[:start] == render


def test_environment_ids_carry_the_ipython_role_and_turn_ends(llama_tokenizer):
    fmt = chat_format(llama_tokenizer)
    tools = [{"role": "tool", "content": "a"}, {"role": "tool", "content": '{"b": "ü"}'}]
    assert llama_tokenizer.decode(fmt.env_ids(tools)) == (
        '<|start_header_id|>ipython<|end_header_id|>\n\n{"output": "a"}\n{"output": "{\\"b\\": '
        '\\"ü\\"}"}<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n'
    )
    user = [{"role": "user", "content": "next"}]
    assert fmt.env_ids(user, turn_closed=False) == [fmt.end_of_turn_id] + fmt.env_ids(user)
    # A reply the model ends with <|eom_id|> (a message that awaits tool output) is closed too:
    # the environment appends its messages right after it.
    eom = llama_tokenizer.convert_tokens_to_ids("<|eom_id|>")
    assert fmt.turn_closed(fmt.encode("[pwd()]") + [eom]) and not fmt.turn_closed([eom, 5])
    with pytest.raises(Exception, match="lists no tools"):
        fmt.render(CONVERSATION[:2], tools=[{"name": "pwd"}])


def test_rendered_episode_messages_tokenize_append_only(llama_tokenizer):
    """A real episode's observations (the release protocol's error message, tool results, the
    next user turn) appended to the live ids give the render of its whole transcript."""
    fmt = chat_format(llama_tokenizer)
    renderer = dataclasses.replace(Renderer(prompt_style="release"), tool_format=fmt.tool_format)
    episode = Episode(load_task("multi_turn_base_0"), EpisodeConfig(mode="release"), renderer)
    ids = fmt.prompt_ids(episode.reset())
    for reply in ("[cd(folder=document)]", "[cd(folder='document'), ls()]", "Done."):
        ids += fmt.encode(reply) + [fmt.end_of_turn_id]
        observation, done = episode.step(reply)
        ids += fmt.env_ids(observation)
    transcript = episode.transcript
    assert ids == fmt.encode(fmt.render(transcript, add_generation_prompt=True))
    assert [m["role"] for m in transcript[2:5]] == ["assistant", "user", "assistant"]
