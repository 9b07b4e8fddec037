"""The rollout engine against transformers (greedy generate, logits) and its own bookkeeping."""

import jax
import numpy as np
import pytest
import torch

from seal_jax.episodes import _task_opening
from seal_jax.models import forward_logits, init_cache, load_hf_checkpoint
from seal_jax.rollout import CONTEXT_LIMIT, MAX_NEW_TOKENS, STOP, EngineConfig, RolloutEngine
from seal_jax.sampler import SamplingParams, filtered_logits
from tests import hf_models
from tests.devices import in_background, run_with_devices, selected

PROMPT_LENGTHS = (5, 11, 3)


def prompts(vocab, lengths=PROMPT_LENGTHS, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, vocab - 1, n).tolist() for n in lengths]


GREEDY = SamplingParams("greedy")


def engine(path, sampling=GREEDY, **overrides):
    model = load_hf_checkpoint(path)
    settings = dict(
        context_limit=96,
        max_new_tokens=10,
        stop_ids=(model.config.vocab_size - 1,),
        sampling=sampling,
        prefill_chunk=8,
        decode_segment=4,  # several segments per turn: compaction and parking get exercised
        min_cache_len=16,
    )
    settings.update(overrides)
    return RolloutEngine(model.config, model.mesh, EngineConfig(**settings)), model.params


def hf_greedy(torch_model, prompt, n):
    with torch.no_grad():
        out = torch_model.generate(
            torch.tensor([prompt]),
            max_new_tokens=n,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
        )
    return out[0, len(prompt) :].tolist()


@pytest.mark.parametrize("variant", ["qwen2_tied", "qwen3"])
def test_greedy_matches_transformers_generate(tiny_checkpoints, variant):
    path, torch_model = tiny_checkpoints[variant]
    ps = prompts(torch_model.config.vocab_size)
    references = [hf_greedy(torch_model, p, 10) for p in ps]
    # A stop id taken from the middle of row 0's reference: row 0 must stop right there.
    stop = references[0][4]
    first_stop = references[0].index(stop)
    eng, params = engine(path, stop_ids=(stop,))
    # Two samples per prompt share one prefill; greedy makes them identical to the reference.
    turns = eng.start(params, ps, num_samples=2).generate()
    for r, turn in turns.items():
        ref = references[r // 2]
        cut = ref.index(stop) + 1 if stop in ref else len(ref)
        assert turn.ids == ref[:cut]
        assert turn.stop_reason == (STOP if stop in ref else MAX_NEW_TOKENS)
    assert turns[0].stop_reason == STOP and len(turns[0].ids) == first_stop + 1
    counts = eng.compile_counts()
    eng.start(params, prompts(torch_model.config.vocab_size, seed=1), num_samples=2).generate()
    assert eng.compile_counts() == counts  # same buckets: nothing recompiled
    # The engine holds no weights: a rollout samples from the params it was started with, and
    # new weights of the same layout reuse the compiled programs.
    negated = jax.tree.map(lambda x: -x, params)
    other = eng.start(negated, ps, num_samples=2).generate()
    assert eng.compile_counts() == counts
    assert [t.ids for t in other.values()] != [t.ids for t in turns.values()]


def multi_turn(eng, params, vocab, seed=0):
    """Three turns; row 1 ends after the first, env messages of different lengths; rows 0 and 2
    have short first replies, so rows 1 and 3 finish that turn in a compacted cache."""
    rng = np.random.default_rng(seed)
    rollout = eng.start(params, prompts(vocab, (6, 13)), num_samples=2, seed=seed)
    log = {r: [] for r in range(4)}
    for turn in range(3):
        if turn == 0:
            env = None
        else:
            live = [r for r in rollout.live_rows() if not (turn == 1 and r == 1)]
            env = {r: rng.integers(0, vocab - 1, 3 + 7 * r).tolist() for r in live}
            for r, ids in env.items():
                log[r].append(("env", ids))
        budget = {0: 2, 2: 3} if turn == 0 else None
        for r, t in rollout.generate(env, max_new_tokens=budget).items():
            log[r].append(("model", t.ids))
    return rollout, log


SAMPLED = SamplingParams("sample", temperature=0.8, top_k=40, top_p=0.9)


@pytest.fixture(scope="module")
def sampled_multi_turn(tiny_checkpoints):
    """(engine, params, rollout, log) of `multi_turn` on qwen2_untied with SAMPLED: checked
    against teacher forcing, and the unfloored reference of the floors test."""
    path, torch_model = tiny_checkpoints["qwen2_untied"]
    eng, params = engine(path, sampling=SAMPLED)
    return (eng, params, *multi_turn(eng, params, torch_model.config.vocab_size))


def test_logprobs_match_teacher_forced_forward_pass(tiny_checkpoints, sampled_multi_turn):
    path, _ = tiny_checkpoints["qwen2_untied"]
    _, _, rollout, log = sampled_multi_turn
    sequences = rollout.sequences()
    # Teacher forcing: one batched forward pass over the final sequences (right-padded).
    width = max(len(seq.token_ids) for seq in sequences)
    ids = np.zeros((len(sequences), width), np.int32)
    for r, seq in enumerate(sequences):
        ids[r, : len(seq.token_ids)] = seq.token_ids
    model = load_hf_checkpoint(path)
    positions = np.broadcast_to(np.arange(width), ids.shape)
    real = positions < np.asarray([[len(seq.token_ids)] for seq in sequences])
    logits, _ = forward_logits(model.params, model.config, ids, positions, real)
    for r, seq in enumerate(sequences):
        # Token-in / token-out: prompt, then exactly the sampled and environment ids in order.
        expected = list(rollout.prompts[r // 2])
        mask = [False] * len(expected)
        for kind, turn_ids in log[r]:
            expected += turn_ids
            mask += [kind == "model"] * len(turn_ids)
        assert seq.token_ids.tolist() == expected and seq.loss_mask.tolist() == mask
        n = len(seq.token_ids)
        row_logits = logits[r, : n - 1]  # row_logits[t] predicts token t + 1
        target = seq.token_ids[1:]
        policy = jax.nn.log_softmax(row_logits)[np.arange(n - 1), target]
        used = jax.nn.log_softmax(filtered_logits(row_logits, SAMPLED))[np.arange(n - 1), target]
        on = seq.loss_mask[1:]
        assert on.sum() >= 10
        np.testing.assert_allclose(seq.policy_logprobs[1:][on], np.asarray(policy)[on], atol=1e-4)
        np.testing.assert_allclose(seq.sampling_logprobs[1:][on], np.asarray(used)[on], atol=1e-4)
        assert np.all(seq.sampling_logprobs[~seq.loss_mask] == 0)
        assert np.all(seq.policy_logprobs[~seq.loss_mask] == 0)
    # Samples of one prompt differ: each row has its own key.
    assert sequences[0].token_ids.tolist() != sequences[1].token_ids.tolist()


@pytest.mark.parametrize("per_row", [True, False])
def test_three_turn_cache_continuation_equals_one_forward_pass(tiny_checkpoints, per_row):
    """Ragged chunks appended turn by turn give torch's logits of one pass over each row.

    per_row: per-row write pointers (the engine's cache); else one shared write index, where
    every row's chunk occupies the same slots and padding stays in the cache, masked."""
    path, torch_model = tiny_checkpoints["qwen3"]
    model = load_hf_checkpoint(path)
    rng = np.random.default_rng(4)
    chunk_lengths = [(7, 3), (2, 9), (5, 1)]  # (row 0, row 1) per turn
    rows = [[], []]
    cache = init_cache(model.config, 2, 32, per_row=per_row)
    got = [[], []]
    for lengths in chunk_lengths:
        width = max(lengths) + 2  # right padding beyond the longest row too
        ids = np.zeros((2, width), np.int32)
        for b, n in enumerate(lengths):
            ids[b, :n] = rng.integers(0, model.config.vocab_size, n)
        pos = np.asarray([[len(r)] for r in rows]) + np.arange(width)
        mask = np.arange(width) < np.asarray(lengths)[:, None]
        logits, cache = forward_logits(model.params, model.config, ids, pos, mask, cache)
        for b, n in enumerate(lengths):
            rows[b] += ids[b, :n].tolist()
            got[b].append(np.asarray(logits[b, :n]))
    for b in range(2):
        seq = np.asarray([rows[b]])
        want = hf_models.torch_logits(
            torch_model, seq, np.arange(seq.shape[1])[None], np.ones_like(seq)
        )
        assert np.abs(np.concatenate(got[b]) - want[0]).max() <= 1e-4
    slots_used = [len(r) for r in rows] if per_row else 9 + 11 + 7
    assert np.asarray(cache["index"]).tolist() == slots_used


def test_context_limit_stops_rows_with_a_reason(tiny_checkpoints):
    path, torch_model = tiny_checkpoints["qwen2_untied"]
    vocab = torch_model.config.vocab_size
    eng, params = engine(path, context_limit=20, max_new_tokens=8)
    with pytest.raises(ValueError, match="prompt 0 has 20 tokens"):
        eng.start(params, [[1] * 20])
    with pytest.raises(ValueError, match="env_ids=None on the first"):
        eng.start(params, [[1]]).generate({0: [2]})
    rollout = eng.start(params, prompts(vocab, (14, 4)))
    turns = rollout.generate()
    assert turns[0].stop_reason == CONTEXT_LIMIT and len(turns[0].ids) == 6
    assert turns[1].stop_reason == MAX_NEW_TOKENS and len(turns[1].ids) == 8
    assert rollout.live_rows() == [1]
    with pytest.raises(ValueError, match="not live rows"):
        rollout.generate({0: [1]})
    turns = rollout.generate({1: [5] * 8})  # 12 + 8 tokens leave no room for a reply
    assert turns[1].stop_reason == CONTEXT_LIMIT and turns[1].ids == []
    seqs = rollout.sequences()
    assert [len(s.token_ids) for s in seqs] == [20, 12]
    assert [s.stop_reason for s in seqs] == [CONTEXT_LIMIT, CONTEXT_LIMIT]
    assert rollout.live_rows() == []


SHARDED = """
import dataclasses, json, sys
import numpy as np
from seal_jax.continuous import ContinuousRollout
from seal_jax.models import load_hf_checkpoint
from seal_jax.rollout import EngineConfig, RolloutEngine
from seal_jax.sampler import SamplingParams
from seal_jax.sharding import make_mesh, single_device_mesh
path = sys.argv[1]
rng = np.random.default_rng(0)
def run(mesh):
    model = load_hf_checkpoint(path, mesh=mesh)
    cfg = EngineConfig(context_limit=64, max_new_tokens=6, stop_ids=(-1,),
                       sampling=SamplingParams("greedy"), prefill_chunk=8, decode_segment=4,
                       min_cache_len=16)
    eng = RolloutEngine(model.config, mesh, cfg)
    prompts = [[3, 1, 4, 1, 5], [9, 2, 6], [5, 3, 5, 8, 9, 7, 9]]
    rollout = eng.start(model.params, prompts, num_samples=3)
    rollout.generate(max_new_tokens={r: 2 for r in range(0, 9, 2)})  # 4 rows go on: compaction
    rollout.generate({r: [7] * (r + 1) for r in range(0, 9, 2)})
    rollout.generate({r: [8, 8] for r in range(0, 9, 4)})
    k = rollout._parts[0][0]["k"]  # the live cache after the last turn
    layout = [list(a) if isinstance(a, tuple) else a for a in k.sharding.spec]
    # The same episodes streamed through 8 slots (continuous batching; a segment of at most 4
    # rows decodes those rows only), with floors that keep its compiled programs few.
    floors = dict(min_batch=4, min_prefill_width=8, min_cache_len=64)
    eng = RolloutEngine(model.config, mesh, dataclasses.replace(cfg, **floors))
    stream = ContinuousRollout(eng, model.params, slots=8, seed=0)
    for p, prompt in enumerate(prompts):
        rows = range(3 * p, 3 * p + 3)
        stream.add(prompt, rows, max_new_tokens={r: 6 - 4 * (r % 2 == 0) for r in rows})
    turns = dict.fromkeys(range(9), 0)
    while stream.busy:
        for r in stream.step():
            turns[r] += 1
            if turns[r] == 1 and r % 2 == 0:
                stream.extend(r, [7] * (r + 1))
            elif turns[r] == 2 and r % 4 == 0:
                stream.extend(r, [8, 8])
            else:
                stream.finish(r)
    streamed = [s.token_ids.tolist() for _, s in sorted(stream.sequences().items())]
    rows = [s.token_ids.tolist() for s in rollout.sequences()]
    return rows, (layout, len(k.devices())), streamed == rows, eng.compile_counts()["decode_rows"]
one, _, streamed_one, _ = run(single_device_mesh())
eight, spec, streamed_eight, decode_rows = run(make_mesh(data=4, fsdp=1, tensor=2))
same = one == eight and streamed_one and streamed_eight
print(json.dumps({"same": same, "spec": spec, "rows": one, "decode_rows": decode_rows}))
"""


@pytest.fixture(scope="module", autouse=True)
def sharded_run(request):
    """SHARDED, started in the background (tests.devices) when the module's first test runs,
    beside the in-process tests, when the test that reads it is selected."""
    if not selected(request, test_eight_devices_give_the_same_greedy_tokens):
        yield None
        return
    path, _ = request.getfixturevalue("tiny_checkpoints")["qwen3"]
    job = in_background(run_with_devices, f"import sys; sys.argv = ['x', {path!r}]\n" + SHARDED)
    yield job
    job.cancel()


def test_eight_devices_give_the_same_greedy_tokens(sharded_run):
    """One device and 8 (4 batch shards x 2 tensor), lockstep and continuous batching (8 slots):
    the same tokens."""
    out = sharded_run.result()
    result = __import__("json").loads(out.strip().splitlines()[-1])
    assert result["spec"] == [[None, ["data", "fsdp"], "tensor", None, None], 8]
    assert result["same"], result["rows"]
    assert result["decode_rows"] > 0  # some segments decoded only their rows, over 4 shards
    assert [len(r) for r in result["rows"]][:3] == [5 + 2 + 1 + 6 + 2 + 6, 5 + 6, 5 + 2 + 3 + 6]


def test_cache_shrinks_when_the_long_row_ends_first(tiny_checkpoints):
    """Regression: when the long rows end and only short rows continue, the next turn's cache
    bucket is smaller than the current cache; the relayout used to crash in jnp.pad ("index
    can't contain negative values"). The short rows must continue in the smaller cache and
    their log-probs must match a teacher-forced forward pass."""
    path, torch_model = tiny_checkpoints["qwen2_untied"]
    vocab = torch_model.config.vocab_size
    sampling = SamplingParams("sample", temperature=0.8)
    # Stop id out of reach: every turn runs its full budget, so the cache sizes are fixed.
    eng, params = engine(path, sampling=sampling, stop_ids=(vocab,), context_limit=128)
    rng = np.random.default_rng(7)
    rollout = eng.start(params, prompts(vocab, (40, 3)), num_samples=1, seed=3)
    log = {0: [], 1: []}
    for r, t in rollout.generate(max_new_tokens=6).items():  # 40 + 6 tokens: 48 slots (3 x 16)
        log[r].append(("model", t.ids))
    first_len = rollout._parts[0][0]["mask"].shape[1]
    # Row 0 (the long one) ends; row 1 holds 3 + 6 + 4 tokens and gets 6 more: 24 slots.
    env = rng.integers(0, vocab - 1, 4).tolist()
    log[1].append(("env", env))
    turns = rollout.generate({1: env}, max_new_tokens=6)
    assert list(turns) == [1] and len(turns[1].ids) == 6
    log[1].append(("model", turns[1].ids))
    second_len = rollout._parts[0][0]["mask"].shape[1]
    assert (first_len, second_len) == (48, 24)  # the cache really shrank
    # A third turn for row 1 in the shrunk cache.
    env = rng.integers(0, vocab - 1, 2).tolist()
    log[1].append(("env", env))
    log[1].append(("model", rollout.generate({1: env}, max_new_tokens=5)[1].ids))
    assert rollout.live_rows() == [1]
    model = load_hf_checkpoint(path)
    for r, seq in enumerate(rollout.sequences()):
        expected, mask = list(rollout.prompts[r]), [False] * len(rollout.prompts[r])
        for kind, ids in log[r]:
            expected += ids
            mask += [kind == "model"] * len(ids)
        assert seq.token_ids.tolist() == expected and seq.loss_mask.tolist() == mask
        n = len(expected)
        ids = np.asarray([expected], np.int32)
        positions = np.arange(n)[None]
        logits, _ = forward_logits(
            model.params, model.config, ids, positions, np.ones_like(ids, bool)
        )
        policy = jax.nn.log_softmax(logits[0, : n - 1])[np.arange(n - 1), ids[0, 1:]]
        on = seq.loss_mask[1:]
        assert on.sum() == (6 if r == 0 else 17)
        np.testing.assert_allclose(seq.policy_logprobs[1:][on], np.asarray(policy)[on], atol=1e-4)


def test_batch_and_width_floors_change_only_the_padding(tiny_checkpoints, sampled_multi_turn):
    """Floors on the batch bucket and the prefill width pad small batches and short pieces
    (fewer compiled programs): the same rows must come out as from the unfloored engine."""
    path, torch_model = tiny_checkpoints["qwen2_untied"]
    plain, params, ref, _ = sampled_multi_turn
    floored, _ = engine(path, sampling=SAMPLED, min_batch=8, min_prefill_width=4)
    got, _ = multi_turn(floored, params, torch_model.config.vocab_size)
    for a, b in zip(ref.sequences(), got.sequences(), strict=True):
        assert b.token_ids.tolist() == a.token_ids.tolist()
        assert b.loss_mask.tolist() == a.loss_mask.tolist()
        np.testing.assert_allclose(b.sampling_logprobs, a.sampling_logprobs, atol=1e-5)
    assert got._parts[0][0]["mask"].shape[0] == 8  # 4 rows in a batch of 8
    few, many = floored.compile_counts(), plain.compile_counts()
    assert few["decode"] < many["decode"] and few["prefill"] < many["prefill"]
    with pytest.raises(ValueError, match="min_batch must be a power of two, got 3"):
        EngineConfig(context_limit=96, max_new_tokens=10, stop_ids=(0,), min_batch=3)


def test_task_prompt_comes_from_a_row_that_started():
    opening = [{"role": "user", "content": "hi"}]
    assert _task_opening([[], opening, []], "t") == opening  # row 0's worker was lost
    with pytest.raises(RuntimeError, match="task t: none of its episodes could start"):
        _task_opening([[], []], "t")
