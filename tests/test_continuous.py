"""Continuous batching (seal_jax/continuous.py) against the lockstep engine and a forward pass."""

import jax
import numpy as np
import pytest

from seal_jax.continuous import ContinuousRollout
from seal_jax.models import forward_logits, load_hf_checkpoint
from seal_jax.rollout import CONTEXT_LIMIT, EngineConfig, RolloutEngine
from seal_jax.sampler import SamplingParams
from tests.test_rollout import engine, prompts

SAMPLING = SamplingParams("sample", temperature=0.8)
TURNS = (3, 1, 2, 3, 2, 1)  # model turns of each of the 6 rows (3 prompts x 2 samples)


def env_ids(vocab, row, turn):
    """The environment's reply to a row's turn: lengths from 1 to 20 tokens."""
    rng = np.random.default_rng([row, turn])
    return rng.integers(0, vocab - 1, 1 + (7 * row + 5 * turn) % 20).tolist()


def budget(row, turn):
    return 3 + (row * 5 + turn * 3) % 8  # 3 .. 10 tokens: replies of different lengths


def run_lockstep(eng, params, vocab, seed):
    rollout = eng.start(params, prompts(vocab, (6, 13, 4)), num_samples=2, seed=seed)
    turns = rollout.generate(max_new_tokens={r: budget(r, 0) for r in range(6)})
    for turn in range(1, max(TURNS)):
        live = [r for r in turns if TURNS[r] > turn]
        env = {r: env_ids(vocab, r, turn) for r in live}
        turns = rollout.generate(env, max_new_tokens={r: budget(r, turn) for r in live})
    return {r: s for r, s in enumerate(rollout.sequences())}


def run_continuous(eng, params, vocab, seed, slots, order_seed=0):
    """The same episodes through `slots` slots; observations come back in a shuffled order,
    some a round late, as an asynchronous environment would return them."""
    stream = ContinuousRollout(eng, params, slots=slots, seed=seed, refill=1)
    for p, prompt in enumerate(prompts(vocab, (6, 13, 4))):
        rows = [2 * p, 2 * p + 1]
        stream.add(prompt, rows, max_new_tokens={r: budget(r, 0) for r in rows})
    rng = np.random.default_rng(order_seed)
    done_turns, waiting, rounds = dict.fromkeys(range(6), 0), [], 0
    while stream.busy:
        rounds += 1
        for r in stream.step():
            done_turns[r] += 1
            waiting.append(r)
        rng.shuffle(waiting)
        back, waiting = waiting[: rng.integers(0, len(waiting) + 1)], waiting
        if not stream.decoding:
            back = waiting
        for r in back:
            waiting.remove(r)
            turn = done_turns[r]
            if turn == TURNS[r]:
                stream.finish(r)
            else:
                stream.extend(r, env_ids(vocab, r, turn), max_new_tokens=budget(r, turn))
    return stream.sequences(), rounds


# Floors that keep the number of compiled programs (and the test's time) small.
FLOORS = dict(min_batch=2, min_prefill_width=8, min_cache_len=64)


@pytest.fixture(scope="module")
def lockstep(tiny_checkpoints):
    path, torch_model = tiny_checkpoints["qwen2_untied"]
    eng, params = engine(path, sampling=SAMPLING, **FLOORS)
    return eng, params, run_lockstep(eng, params, torch_model.config.vocab_size, seed=5)


@pytest.mark.parametrize("slots", [2, 8])
def test_continuous_gives_the_lockstep_episodes(tiny_checkpoints, lockstep, slots):
    """Rows stream through fewer or more slots than rows, observations arriving in a shuffled
    order: the same tokens as the lockstep engine, row by row, and log-probs equal to a
    teacher-forced forward pass."""
    path, torch_model = tiny_checkpoints["qwen2_untied"]
    vocab = torch_model.config.vocab_size
    eng, params, ref = lockstep
    got, rounds = run_continuous(eng, params, vocab, seed=5, slots=slots, order_seed=slots)
    assert sorted(got) == list(range(6))
    for r in range(6):
        assert got[r].token_ids.tolist() == ref[r].token_ids.tolist(), r
        assert got[r].loss_mask.tolist() == ref[r].loss_mask.tolist(), r
        np.testing.assert_allclose(got[r].policy_logprobs, ref[r].policy_logprobs, atol=1e-5)
    assert rounds > max(TURNS)  # turns really interleaved across rounds
    model = load_hf_checkpoint(path)
    for seq in got.values():
        n = len(seq.token_ids)
        ids = seq.token_ids[None]
        logits, _ = forward_logits(
            model.params, model.config, ids, np.arange(n)[None], np.ones_like(ids, bool)
        )
        policy = np.asarray(jax.nn.log_softmax(logits[0, : n - 1]))[np.arange(n - 1), ids[0, 1:]]
        on = seq.loss_mask[1:]
        np.testing.assert_allclose(seq.policy_logprobs[1:][on], policy[on], atol=1e-4)


def test_slots_bound_the_cache_and_rows_end_at_the_context_limit(tiny_checkpoints):
    path, torch_model = tiny_checkpoints["qwen2_untied"]
    vocab = torch_model.config.vocab_size
    eng, params = engine(path, sampling=SAMPLING, stop_ids=(vocab,), context_limit=48)
    stream = ContinuousRollout(eng, params, slots=2, seed=0)
    for p, prompt in enumerate(prompts(vocab, (30, 5, 7))):
        stream.add(prompt, rows=[p])
    reasons = {}
    while stream.busy:
        for r, turn in stream.step().items():
            reasons.setdefault(r, []).append(turn.stop_reason)
            assert stream._cache["mask"].shape[0] == 2  # two slots, whatever the row count
            if turn.stop_reason != CONTEXT_LIMIT:
                stream.extend(r, env_ids(vocab, r, len(reasons[r])))
    # 10-token turns with ~10-token observations: every row runs into the 48-token limit.
    assert all(rs[-1] == CONTEXT_LIMIT for rs in reasons.values()), reasons
    assert all(len(s.token_ids) <= 48 for s in stream.sequences().values())
    with pytest.raises(ValueError, match="multiple of the engine's batch shards"):
        ContinuousRollout(eng, params, slots=0, seed=0)
    with pytest.raises(ValueError, match="is done, not waiting"):
        stream.extend(0, [1])


def test_streamed_episodes_equal_lockstep_episodes(suite_model):
    """The episode drivers on the suite's tasks with the asynchronous pool: streaming through 4
    slots gives the lockstep driver's episodes (tokens, verdicts), and a host share that
    starts at row 8 samples as rows 8.. of the whole batch."""
    from configs.tiny import get_config
    from environments.sources import get_source
    from seal_jax import episodes
    from seal_jax.chat import ChatFormat

    model = load_hf_checkpoint(suite_model)
    chat = ChatFormat(model.tokenizer())
    config = get_config()
    eng = RolloutEngine(
        model.config,
        model.mesh,
        EngineConfig.from_config(config.rollout, 24, chat.stop_ids, SAMPLING),
    )
    source = get_source("suite")
    tasks = source.split_ids("train")[:4]
    with episodes.open_pool(source, config.env, "official") as pool:
        run = dict(num_samples=2, seed=11)
        whole = episodes.generate_episodes(eng, model.params, chat, pool, tasks, **run)
        tail = episodes.generate_episodes(
            eng, model.params, chat, pool, tasks[2:], **run, first_row=4
        )
        streamed = episodes.stream_episodes(eng, model.params, chat, pool, tasks, **run, slots=4)
    for got in (streamed.sequences, whole.sequences[:4] + tail.sequences):
        for a, b in zip(whole.sequences, got, strict=True):
            assert a.token_ids.tolist() == b.token_ids.tolist()
    assert [r.reward for r in streamed.results] == [r.reward for r in whole.results]
    assert [r.turn_tags for r in streamed.results] == [r.turn_tags for r in whole.results]
    assert max(len(s.token_ids) - s.prompt_len for s in whole.sequences) > 24  # several turns
