"""The suite's tiny tokenizer: loads as a normal HF tokenizer, Qwen's format, short episodes."""

import json
import os
import subprocess
import sys

import pytest
from transformers import AutoTokenizer

from environments.episode import Episode, EpisodeConfig
from environments.policies import NO_ACTION, oracle_turns
from environments.rendering import Renderer
from environments.suite import load_task, load_tasks
from environments.suite.tokenizer import (
    SPECIAL_TOKENS,
    TOKENIZER_DIR,
    TOOL_TOKENS,
    TOOLS_TAGS,
    VOCAB_SIZE,
    build_tokenizer,
)
from environments.toolcall import parse_reply

EPISODE_TOKEN_LIMIT = 1024  # What a tiny policy's context must hold (see the suite README).


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(str(TOKENIZER_DIR), local_files_only=True)


def oracle_transcript(task):
    episode = Episode(task)
    episode.reset()
    for messages in oracle_turns(task):
        for text in messages:
            episode.act(text)
        episode.finish_turn()
    return episode.transcript


def as_qwen_messages(task, transcript):
    """The transcript as a Qwen caller writes it: system text apart from the tools, and
    assistant calls as structured `tool_calls`."""
    messages = [{"role": "system", "content": task.system_preamble}]
    for message in transcript[1:]:
        if message["role"] == "assistant" and message["content"].startswith("<tool_call>"):
            calls = parse_reply(message["content"]).calls
            tool_calls = [
                {"type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                for c in calls
            ]
            messages.append({"role": "assistant", "content": "", "tool_calls": tool_calls})
        else:
            messages.append({"role": message["role"], "content": message["content"]})
    return messages


TASK = "multi_turn_miss_func_eval-3"  # A reveal, then two calls in one message.


def test_builds_are_deterministic(tmp_path):
    build_tokenizer(tmp_path / "here")
    command = [sys.executable, "-m", "environments.suite.tokenizer", f"--out={tmp_path / 'there'}"]
    env = {**os.environ, "PYTHONHASHSEED": "3", "RAYON_NUM_THREADS": "1"}
    subprocess.run(command, env=env, check=True, capture_output=True)
    names = sorted(p.name for p in (tmp_path / "here").iterdir())
    assert names == sorted(p.name for p in (tmp_path / "there").iterdir())
    assert names == sorted(p.name for p in TOKENIZER_DIR.iterdir())
    for name in names:
        assert (tmp_path / "here" / name).read_bytes() == (tmp_path / "there" / name).read_bytes()
    assert sum((TOKENIZER_DIR / name).stat().st_size for name in names) < 1_000_000


def test_special_tokens_are_single_ids_after_the_bpe_vocabulary(tokenizer):
    added = SPECIAL_TOKENS + TOOL_TOKENS + TOOLS_TAGS
    ids = [tokenizer.encode(token, add_special_tokens=False) for token in added]
    assert all(len(i) == 1 for i in ids)
    first = ids[0][0]
    assert first <= VOCAB_SIZE and [i[0] for i in ids] == list(range(first, first + len(added)))
    assert len(tokenizer) == first + len(added)
    assert (tokenizer.eos_token, tokenizer.pad_token, tokenizer.bos_token) == (
        "<|im_end|>",
        "<|endoftext|>",
        None,
    )
    assert set(tokenizer.all_special_tokens) == set(SPECIAL_TOKENS)
    # No BPE merge swallowed a piece of an added token: they were cut out of the corpus.
    bpe = [t for t, i in tokenizer.get_vocab().items() if i < first]
    assert not [t for t in bpe if "<|" in t or "|>" in t or "<t" in t or "</" in t]


def test_chat_template_renders_the_environments_prompt_and_round_trips(tokenizer):
    task = load_task(TASK)
    transcript = oracle_transcript(task)
    tools = Renderer().tools(task.docs)
    qwen_messages = as_qwen_messages(task, transcript)
    text = tokenizer.apply_chat_template(qwen_messages, tools=tools, tokenize=False)
    # The environment's system prompt already holds the tools section and its assistant text
    # is what Qwen writes for tool_calls: the same render either way.
    assert text == tokenizer.apply_chat_template(transcript, tokenize=False)
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert tokenizer.decode(ids) == text
    im_start, im_end, call = tokenizer.convert_tokens_to_ids(
        ["<|im_start|>", "<|im_end|>", "<tool_call>"]
    )
    roles = [m["role"] for m in transcript]
    tool_groups = sum(r == "tool" and p != "tool" for p, r in zip(["-"] + roles, roles))
    turns = len([r for r in roles if r != "tool"]) + tool_groups
    assert ids.count(im_start) == ids.count(im_end) == turns
    calls = sum(len(turn) for turn in task.ground_truth)
    assert ids.count(call) == 2 + calls  # two in the system prompt's format lines
    prompt = tokenizer.apply_chat_template(
        transcript[:2], tokenize=False, add_generation_prompt=True
    )
    assert prompt.endswith("<|im_end|>\n<|im_start|>assistant\n") and text.startswith(prompt)


def test_error_episodes_round_trip(tokenizer):
    texts = []
    for task in load_tasks("eval")[::10]:
        episode = Episode(task, EpisodeConfig(mode="training"))
        episode.reset()
        episode.step('<tool_call>\n{"name": "nope", "arguments": {"x": "é"}}\n</tool_call>')
        done = False
        while not done:
            _, done = episode.step(NO_ACTION)
        texts.append(tokenizer.apply_chat_template(episode.transcript, tokenize=False))
    for text in texts:
        assert tokenizer.decode(tokenizer.encode(text, add_special_tokens=False)) == text


def test_suite_episodes_are_short(tokenizer):
    lengths = {}
    for task in load_tasks("eval"):
        text = tokenizer.apply_chat_template(oracle_transcript(task), tokenize=False)
        lengths[task.task_id] = len(tokenizer.encode(text, add_special_tokens=False))
    longest = max(lengths, key=lengths.get)
    print(json.dumps({"longest": longest, "tokens": lengths[longest]}))
    assert lengths[longest] <= EPISODE_TOKEN_LIMIT
    assert sum(lengths.values()) / len(lengths) < EPISODE_TOKEN_LIMIT / 2
