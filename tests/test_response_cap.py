"""The response cap (train.max_response_tokens): the update trains on each episode's first N ids
after its initial prompt, counted as the SEAL release counts its response."""

import numpy as np
import pytest
from transformers import AutoTokenizer

from configs import qwen, tiny
from configs.base import VARIANTS, base_config
from seal_jax import config as config_lib
from seal_jax import episodes
from seal_jax.chat import ChatFormat
from seal_jax.rollout import TokenSequence
from seal_jax.trajectories import cap_response, training_batch
from tests import hf_models
from tests.test_chat_tokens import CONVERSATION, QWEN25_TEMPLATE, TOOLS, reply_text

H = 90  # an opening id of the hand-made sequence's assistant turns (3 of them: 90, 91, 92)


def hand_made() -> TokenSequence:
    """System and user ids, the first turn's opening, a reply, a tool answer that opens the next
    turn, and a second reply."""
    ids = [1, 2, 3, H, H + 1, H + 2] + [10, 11, 12] + [20, 21, 22, H, H + 1, H + 2] + [13, 14, 15]
    sampled = np.isin(np.arange(len(ids)), [6, 7, 8, 15, 16, 17])
    logprobs = np.where(sampled, -0.5, 0.0).astype(np.float32)
    return TokenSequence(np.asarray(ids, np.int32), sampled, logprobs, logprobs, 6, "stop")


@pytest.mark.parametrize(
    ("max_tokens", "kept", "trained"),
    [
        (100, 18, [10, 11, 12, 13, 14, 15]),  # shorter than the cap: unchanged
        (13, 16, [10, 11, 12, 13]),  # the cut falls in the second reply
        (8, 11, [10, 11, 12]),  # in the tool answer: no later reply id is trained
        (6, 9, [10, 11, 12]),
        (2, 6, []),  # inside the opening ids: nothing trained, the prompt kept
    ],
)
def test_cap_counts_every_id_from_the_first_turns_opening(max_tokens, kept, trained):
    sequence = hand_made()
    capped = cap_response(sequence, max_tokens, response_start=3)  # the opening starts at 3
    assert len(capped.token_ids) == kept
    np.testing.assert_array_equal(capped.token_ids, sequence.token_ids[:kept])
    batch = training_batch([capped], np.ones(1, np.float32), length_multiple=4)
    assert batch["targets"][0][batch["loss_mask"][0]].tolist() == trained
    assert np.all(batch["rollout_logprobs"][0][batch["loss_mask"][0]] == -0.5)


@pytest.fixture
def qwen25():
    tokenizer = AutoTokenizer.from_pretrained(hf_models.qwen_tokenizer_dir(), local_files_only=True)
    tokenizer.chat_template = QWEN25_TEMPLATE
    return ChatFormat(tokenizer)


def engine_sequence(fmt: ChatFormat) -> TokenSequence:
    """The conversation's ids as the engine builds them, loss mask on the sampled replies."""
    first = next(i for i, m in enumerate(CONVERSATION) if m["role"] == "assistant")
    ids = fmt.prompt_ids(CONVERSATION[:first], TOOLS)
    prompt_len, sampled, pending = len(ids), [], []
    for message in CONVERSATION[first:]:
        if message["role"] != "assistant":
            pending.append(message)
            continue
        ids += fmt.env_ids(pending) if pending else []
        pending, start = [], len(ids)
        ids += fmt.encode(reply_text(message)) + [fmt.end_of_turn_id]
        sampled += range(start, len(ids))
    mask = np.isin(np.arange(len(ids)), sampled)
    zeros = np.zeros(len(ids), np.float32)
    return TokenSequence(np.asarray(ids, np.int32), mask, zeros, zeros, prompt_len, "stop")


@pytest.mark.parametrize("max_tokens", [1, 3, 40, 75, 10_000])
def test_training_sequences_cut_where_the_release_cuts(qwen25, max_tokens):
    tokenizer = qwen25.tokenizer
    assert episodes.generation_prompt_len(qwen25) == 3  # <|im_start|> assistant \n
    sequence = engine_sequence(qwen25)
    # The release: prompt = the opening messages as rendered, response = every later id of the
    # rendered conversation (its first assistant turn's opening included), cut at max_tokens.
    first = next(i for i, m in enumerate(CONVERSATION) if m["role"] == "assistant")
    prompt = tokenizer.apply_chat_template(CONVERSATION[:first], tools=TOOLS, tokenize=False)
    conversation = tokenizer.apply_chat_template(CONVERSATION, tools=TOOLS, tokenize=False)
    assert conversation.startswith(prompt)
    release_prompt = tokenizer.encode(prompt, add_special_tokens=False)
    release_ids = tokenizer.encode(conversation, add_special_tokens=False)
    (capped,) = episodes.training_sequences([sequence], qwen25, max_tokens)
    end = max(len(release_prompt) + max_tokens, sequence.prompt_len)
    assert capped.token_ids.tolist() == release_ids[:end][: len(sequence.token_ids)]
    np.testing.assert_array_equal(capped.loss_mask, sequence.loss_mask[: len(capped.token_ids)])
    assert episodes.training_sequences([sequence], qwen25, 0) == [sequence]  # 0: no cap


def test_cap_is_on_in_the_paper_preset_only():
    assert {qwen.get_config(v).train.max_response_tokens for v in VARIANTS} == {4096}
    assert base_config().train.max_response_tokens == tiny.get_config().train.max_response_tokens
    assert base_config().train.max_response_tokens == 0
    c = base_config()
    c.train.max_response_tokens = -1
    with pytest.raises(config_lib.ConfigError, match=r"train\.max_response_tokens=-1"):
        config_lib.validate(c)
