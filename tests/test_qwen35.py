"""Qwen3.5 (Gated DeltaNet + gated full attention) against transformers' torch implementation:
logits on padded batches in float32 and bfloat16, the chunked linear attention against the
recurrent one, cached continuation, greedy rollouts with rows that park and rejoin, checkpoint
export and the vision-language checkpoint, and the partition rules on 8 simulated devices.

Compiling a program of these models takes seconds on a CPU, so the tests share what they can:
the checkpoints, one jitted forward pass (the float32 parity batch and the rollout's teacher-forced
pass have the same shape) and one two-turn rollout on one engine whose buckets are few."""

import dataclasses
import json
import logging
import os
import shutil
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import transformers
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from seal_jax.models import (
    CheckpointError,
    forward_logits,
    init_cache,
    load_hf_checkpoint,
    save_hf_checkpoint,
)
from seal_jax.models.config import Qwen35Config
from seal_jax.models.qwen35 import chunked_delta_rule, recurrent_delta_rule
from seal_jax.rollout import MAX_NEW_TOKENS
from tests import devices, hf_models
from tests.devices import REPO, TEST_XLA_FLAGS, cpu_env
from tests.test_rollout import engine, hf_greedy, prompts

# Two prompts (each prefilled in one piece of 8) and six new tokens per turn.
PROMPT_LENGTHS, NEW_TOKENS = (6, 9), 6


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """{"qwen35_mixed": (directory, torch model), "vision": the irregular variant (tied
    embeddings, a layer order that does not repeat) saved as the vision-language checkpoint}."""
    path = str(tmp_path_factory.mktemp("qwen35_mixed"))
    out = {"qwen35_mixed": (path, hf_models.build_tiny_qwen35(path, "qwen35_mixed", seed=0))}
    path = str(tmp_path_factory.mktemp("qwen35_vision"))
    torch_model = hf_models.build_tiny_qwen35(path, "qwen35_irregular", seed=1, vision=True)
    out["vision"] = (path, torch_model)
    return out


def _with_chunk(model, chunk):
    """The loaded model with the linear attention run in chunks of `chunk` positions."""
    return dataclasses.replace(model, config=dataclasses.replace(model.config, linear_chunk=chunk))


# One jitted forward pass for the whole module: calls with an equal config and equal shapes (the
# float32 parity batch and the rollout's teacher-forced rows) share one compiled program.
_forward = jax.jit(forward_logits, static_argnames=("cfg", "dtype"))


def _logits(params, cfg, ids, positions, mask, cache=None):
    """float32 logits [B, T, V] and the cache from `_forward` (ids, positions int32, mask bool)."""
    ids, positions = np.asarray(ids, np.int32), np.asarray(positions, np.int32)
    logits, cache = _forward(
        params,
        cfg=cfg,
        input_ids=ids,
        positions=positions,
        mask=np.asarray(mask, bool),
        cache=cache,
    )
    return np.asarray(logits), cache


# The float32 parity batch: 32 wide, as the rollout's teacher-forced rows below.
WIDE_PADDING = ((9, 0), (0, 13), (0, 0), (5, 6))


def test_float32_logits_match_torch_on_padded_batches(checkpoints):
    """Rows left-, right- and both-side padded, linear attention in chunks of 4 (several per
    row, padding inside chunks): the Qwen tolerance (1e-4). (Chunks of 64, transformers' size,
    and the irregular layer order: test_export_then_transformers_load_reproduces_jax_logits.)"""
    path, torch_model = checkpoints["qwen35_mixed"]
    ids, positions, mask = hf_models.padded_batch(
        torch_model.config.vocab_size, t=32, lengths_pad=WIDE_PADDING
    )
    expected = hf_models.torch_logits(torch_model, ids, positions, mask)
    valid = mask.astype(bool)
    model = _with_chunk(load_hf_checkpoint(path), 4)
    got, _ = _logits(model.params, model.config, ids, positions, mask)
    assert np.abs(got[valid] - expected[valid]).max() <= 1e-4


def test_bfloat16_compute_close_to_torch_float32(checkpoints):
    """bfloat16 parameters and compute (float32 parameters with bfloat16 compute: the 8-device
    test). The Qwen tolerances (test_model_parity.py) allow 0.1 at most for the dozen roundings
    on the path to a logit of a 2-layer model; this one has 4, and a linear layer adds its own
    (four input projections, convolution, gated norm, output projection), so the bound on the
    largest error is doubled. The mean (0.02) is the Qwen one. transformers' own bfloat16 run of
    these models misses 0.1 as well (0.10 to 0.21)."""
    path, torch_model = checkpoints["qwen35_mixed"]
    ids, positions, mask = hf_models.padded_batch(torch_model.config.vocab_size)
    expected = hf_models.torch_logits(torch_model, ids, positions, mask)
    valid = mask.astype(bool)
    model = load_hf_checkpoint(path, dtype=jnp.bfloat16, compute_dtype=jnp.bfloat16)
    got = np.asarray(model.logits(ids, positions, mask))
    diff = np.abs(got[valid] - expected[valid])
    assert diff.max() <= 0.2 and diff.mean() <= 0.02
    assert (got.argmax(-1) == expected.argmax(-1))[valid].mean() >= 0.85
    assert diff.max() > 1e-4  # genuinely bfloat16


def test_chunked_form_equals_recurrent_form():
    """From a non-zero state, with a chunk size that divides the length and one that does not."""
    rng = np.random.default_rng(0)
    b, t, h, dk, dv = 2, 12, 3, 4, 5
    q, k = (rng.normal(size=(b, t, h, dk)).astype(np.float32) for _ in range(2))
    k /= np.linalg.norm(k, axis=-1, keepdims=True)
    v = rng.normal(size=(b, t, h, dv)).astype(np.float32)
    g = -rng.uniform(0.01, 0.5, size=(b, t, h)).astype(np.float32)
    beta = rng.uniform(0, 1, size=(b, t, h)).astype(np.float32)
    state = rng.normal(size=(b, h, dk, dv)).astype(np.float32)
    chunks = (4, 5)

    @jax.jit  # one program for all forms
    def run(*args):
        return recurrent_delta_rule(*args), [chunked_delta_rule(*args, c) for c in chunks]

    (want_out, want_state), got = run(q, k, v, g, beta, state)
    for out, final in got:
        np.testing.assert_allclose(out, want_out, atol=1e-5)
        np.testing.assert_allclose(final, want_state, atol=1e-5)


@pytest.mark.parametrize("per_row", [True, False])
def test_cache_continuation_equals_one_forward_pass(checkpoints, per_row):
    """Ragged right-padded chunks appended call by call (as tests/test_rollout.py) give torch's
    logits of one pass over each row. The padding holds random ids, and row 2 holds row 0's
    tokens cut elsewhere (12, then none: a call of padding only, then 2): its convolution and
    recurrent states equal row 0's to float rounding, so padding left no trace in them."""
    path, torch_model = checkpoints["qwen35_mixed"]
    model = _with_chunk(load_hf_checkpoint(path), 4)
    vocab = model.config.vocab_size
    rng = np.random.default_rng(4)
    cuts = [(7, 3, 12), (2, 9, 0), (5, 1, 2)]  # tokens of rows 0, 1, 2 per call
    rows = [rng.integers(0, vocab, sum(c[b] for c in cuts)).tolist() for b in range(2)]
    rows.append(rows[0])
    width = max(map(max, cuts)) + 2  # right padding beyond the longest row too
    # Laid out as _forward returns it, so that every call runs one compiled program.
    cache = jax.device_put(
        init_cache(model.config, 3, 48, per_row=per_row), NamedSharding(model.mesh, P())
    )
    done, got = [0, 0, 0], [[], [], []]
    for lengths in cuts:
        ids = rng.integers(0, vocab, (3, width))
        for b, n in enumerate(lengths):
            ids[b, :n] = rows[b][done[b] : done[b] + n]
        pos = np.asarray(done)[:, None] + np.arange(width)
        mask = np.arange(width) < np.asarray(lengths)[:, None]
        logits, cache = _logits(model.params, model.config, ids, pos, mask, cache)
        for b, n in enumerate(lengths):
            got[b].append(logits[b, :n])
            done[b] += n
    for b in range(3):
        seq = np.asarray([rows[b]])
        want = hf_models.torch_logits(
            torch_model, seq, np.arange(seq.shape[1])[None], np.ones_like(seq)
        )
        assert np.abs(np.concatenate(got[b]) - want[0]).max() <= 1e-4
    for name in ("conv", "state"):
        x = np.asarray(cache[name])
        np.testing.assert_allclose(x[:, 2], x[:, 0], atol=1e-5)
    assert np.abs(np.asarray(cache["state"])[:, 0]).max() > 0.1  # the state holds something


@pytest.fixture(scope="module")
def rollout(checkpoints):
    """Two greedy turns of 2 prompts x 2 samples on one engine with few buckets (every cache 32
    slots, every prefill piece 8 wide, batches of 4 and 2), so that four model programs serve
    both turns. Turn 1: rows 0 and 2 stop after 2 and 3 tokens, so rows 1 and 3 finish in a
    compacted cache while rows 0 and 2 are parked. Turn 2: row 1 ends, rows 0 and 2 rejoin with
    environment ids of different lengths; row 0 stops early again (compacted a second time).

    Returns (rollout, {row: turn 1}, {row: env ids}, {row: turn 2}, compile counts)."""
    path, torch_model = checkpoints["qwen35_mixed"]
    vocab = torch_model.config.vocab_size
    eng, params = engine(
        path,
        stop_ids=(vocab,),  # never sampled
        context_limit=32,
        max_new_tokens=NEW_TOKENS,
        decode_segment=3,
        min_cache_len=32,
        min_prefill_width=8,
    )
    run = eng.start(params, prompts(vocab, PROMPT_LENGTHS), num_samples=2)
    first = run.generate(max_new_tokens={0: 2, 2: 3})
    rng = np.random.default_rng(1)
    env = {r: rng.integers(0, vocab - 1, n).tolist() for r, n in ((0, 4), (2, 7), (3, 1))}
    second = run.generate(env, max_new_tokens={0: 2})
    return run, first, env, second, eng.compile_counts()


@pytest.fixture(scope="module")
def greedy_references(checkpoints):
    """transformers' greedy continuations (NEW_TOKENS) of the two prompts."""
    _, torch_model = checkpoints["qwen35_mixed"]
    ps = prompts(torch_model.config.vocab_size, PROMPT_LENGTHS)
    return [hf_greedy(torch_model, p, NEW_TOKENS) for p in ps]


def test_greedy_rollout_matches_transformers_generate(rollout, greedy_references):
    """Turn 1 of the shared rollout: every row's reply is transformers' greedy continuation of
    its prompt, cut at the row's budget (rows 1 and 3 finish after a compaction)."""
    _, first, _, _, _ = rollout
    references = greedy_references
    budgets = {0: 2, 2: 3}
    for r in range(4):
        assert first[r].ids == references[r // 2][: budgets.get(r, NEW_TOKENS)]
        assert first[r].stop_reason == MAX_NEW_TOKENS


def test_multi_turn_rows_that_park_and_rejoin_keep_their_states(checkpoints, rollout):
    """Rows parked in turn 1 and rejoined in turn 2 (and the compacted ones): every sampled
    token is the argmax, and its log-prob the log-softmax, of a teacher-forced pass over the
    finished row."""
    path, _ = checkpoints["qwen35_mixed"]
    run, first, env, second, compiled = rollout
    # Decoded in batches of 4 and of 2: rows were compacted (and the others parked).
    assert compiled["decode"] == compiled["prefill"] == 2
    assert sorted(second) == [0, 2, 3]
    sequences = run.sequences()
    for r, seq in enumerate(sequences):
        parts = [(run.prompts[r // 2], False), (first[r].ids, True)]
        if r in second:
            parts += [(env[r], False), (second[r].ids, True)]
        assert seq.token_ids.tolist() == [i for ids, _ in parts for i in ids]
        assert seq.loss_mask.tolist() == [m for ids, m in parts for _ in ids]
    assert [len(second[r].ids) for r in (0, 2, 3)] == [2, NEW_TOKENS, NEW_TOKENS]
    # Teacher forcing: one pass over the right-padded rows, the shape of the float32 parity test.
    model = _with_chunk(load_hf_checkpoint(path), 4)
    width = 32
    ids = np.zeros((len(sequences), width), np.int32)
    for r, seq in enumerate(sequences):
        ids[r, : len(seq.token_ids)] = seq.token_ids
    positions = np.broadcast_to(np.arange(width), ids.shape)
    real = positions < np.asarray([[len(seq.token_ids)] for seq in sequences])
    logits, _ = _logits(model.params, model.config, ids, positions, real)
    for r, seq in enumerate(sequences):
        n = len(seq.token_ids)
        target = seq.token_ids[1:]
        policy = np.asarray(jax.nn.log_softmax(logits[r, : n - 1]))[np.arange(n - 1), target]
        on = seq.loss_mask[1:]
        assert on.sum() >= 2
        np.testing.assert_array_equal(target[on], logits[r, : n - 1].argmax(-1)[on])
        np.testing.assert_allclose(seq.policy_logprobs[1:][on], policy[on], atol=1e-4)
        assert np.all(seq.sampling_logprobs == 0)  # greedy: a point mass


def test_export_then_transformers_load_reproduces_jax_logits(checkpoints, tmp_path):
    """A vision-language checkpoint loads its language model (one log line for the rest), gives
    torch's logits on the padded batch (chunks of 64: one per row; tied embeddings, a layer order
    that does not repeat), and exports as the text-only causal LM, which transformers and this
    loader read back."""
    path, torch_model = checkpoints["vision"]
    with _absl_records() as records:
        model = load_hf_checkpoint(path)
    ignored = [r for r in records if "ignoring" in r.getMessage()]
    assert len(ignored) == 1 and "vision-tower" in ignored[0].getMessage()
    assert model.config.weight_prefix == "model.language_model."
    assert model.config.linear_chunk == 64 and model.config.tie_word_embeddings
    ids, positions, mask = hf_models.padded_batch(torch_model.config.vocab_size)
    ours = np.asarray(model.logits(ids, positions, mask))
    valid = mask.astype(bool)
    want = hf_models.torch_logits(torch_model, ids, positions, mask)
    assert np.abs(ours[valid] - want[valid]).max() <= 1e-4
    out = str(tmp_path / "export")
    save_hf_checkpoint(out, model.params, model.config, dtype="float32")
    with open(f"{out}/config.json") as f:
        assert json.load(f)["model_type"] == "qwen3_5_text"
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(
        out, local_files_only=True, attn_implementation="eager"
    ).eval()
    theirs = hf_models.torch_logits(reloaded, ids, positions, mask)
    assert np.abs(theirs[valid] - ours[valid]).max() <= 1e-4
    # This loader reads back the same architecture and bit-identical weights (so the same logits).
    again = load_hf_checkpoint(out)
    assert again.config.weight_prefix == "model."
    assert dataclasses.replace(again.config, weight_prefix=model.config.weight_prefix) == (
        model.config
    )
    assert jax.tree.structure(again.params) == jax.tree.structure(model.params)
    for x, y in zip(jax.tree.leaves(again.params), jax.tree.leaves(model.params)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


class _absl_records:
    """Collects the records absl logs (to the "absl" Python logger) inside the block."""

    def __enter__(self) -> list:
        self.records, self.handler = [], logging.Handler()
        self.handler.emit = self.records.append
        self.logger = logging.getLogger("absl")
        self.level = self.logger.level
        self.logger.addHandler(self.handler)
        self.logger.setLevel(logging.INFO)
        return self.records

    def __exit__(self, *exc) -> None:
        self.logger.removeHandler(self.handler)
        self.logger.setLevel(self.level)


@pytest.mark.parametrize(
    "edit, message",
    [
        ({"attention_bias": True}, "attention_bias=true is not supported for qwen3_5"),
        ({"hidden_act": "gelu"}, "hidden_act 'gelu' is not supported"),
        ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4}}, "yarn"),
        ({"layer_types": ["linear_attention", "sliding_attention"] * 2}, "sliding_attention"),
        ({"layer_types": ["full_attention"]}, "layer_types has 1 entries"),
        ({"linear_num_value_heads": 3}, "not a multiple of linear_num_key_heads"),
    ],
)
def test_unsupported_qwen35_fields_are_refused(checkpoints, tmp_path, edit, message):
    out = str(tmp_path / "c")
    shutil.copytree(checkpoints["qwen35_mixed"][0], out)
    with open(f"{out}/config.json") as f:
        cfg = json.load(f)
    cfg.update(edit)
    with open(f"{out}/config.json", "w") as f:
        json.dump(cfg, f)
    with pytest.raises(CheckpointError, match=message):
        load_hf_checkpoint(out)


def test_default_layer_order_is_three_linear_then_one_full():
    d = hf_models.tiny_qwen35_config("qwen35_mixed").to_dict()
    d.pop("layer_types")
    d["num_hidden_layers"] = 8
    cfg = Qwen35Config.from_hf_dict(d)
    assert cfg.layer_pattern == ("linear_attention",) * 3 + ("full_attention",)
    assert (cfg.num_linear_layers, cfg.num_full_layers, cfg.rotary_dim) == (6, 2, 8)


# Two greedy turns of 2 prompts x 4 samples on 4 batch shards, with the rollout fixture's calls:
# turn 1 runs in batches of 8 rows and, once rows 0, 2, 4 and 5 are done, of 4 (the others
# parked in a second cache of 4); turn 2 rejoins rows 0, 2 and 5 (no environment ids) from the
# parked cache with row 3 from the active one. Every cache holds 32 slots and every prefill
# piece is 8 wide: two prefill, two decode and three relayout programs.
SHARDED = """
import dataclasses, json, sys
import jax, jax.numpy as jnp, numpy as np
from seal_jax.models import load_hf_checkpoint
from seal_jax.rollout import EngineConfig, RolloutEngine
from seal_jax.sampler import SamplingParams
from seal_jax.sharding import make_mesh
from tests import hf_models
path, prompts, new_tokens = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])
ids, positions, mask = hf_models.padded_batch(256)
mesh = make_mesh(data=4, fsdp=1, tensor=2)
def spec(x):
    return [list(a) if isinstance(a, tuple) else a for a in x.sharding.spec]
out = {"logits": {}}
model = load_hf_checkpoint(path, mesh=mesh)
for dtype in ("float32", "bfloat16"):
    run = dataclasses.replace(model, compute_dtype=jnp.dtype(dtype))
    out["logits"][dtype] = np.asarray(run.logits(ids, positions, mask), np.float32).tolist()
flat = jax.tree_util.tree_leaves_with_path(model.params)
out["specs"] = {"/".join(str(k.key) for k in p): spec(x) for p, x in flat}
cfg = EngineConfig(context_limit=32, max_new_tokens=new_tokens, stop_ids=(-1,),
                   sampling=SamplingParams("greedy"), prefill_chunk=8, decode_segment=3,
                   min_cache_len=32, min_prefill_width=8)
engine = RolloutEngine(model.config, mesh, cfg)
rollout = engine.start(model.params, prompts, num_samples=4)
rng = np.random.default_rng(1)
out["env"] = {r: rng.integers(0, 255, n).tolist() for r, n in ((0, 4), (2, 7), (3, 1), (5, 0))}
out["turns"], out["caches"] = [], []
for env, budgets in ((None, {0: 2, 2: 1, 4: 3, 5: 2}), (out["env"], {0: 2})):
    out["turns"].append({r: t.ids for r, t in rollout.generate(env, budgets).items()})
    # The caches that carry the rows into the next turn (the parked one too).
    out["caches"].append([{n: spec(x) for n, x in c.items()} for c, _ in rollout._parts])
fields = ("token_ids", "loss_mask", "policy_logprobs")
out["sequences"] = [{f: getattr(s, f).tolist() for f in fields} for s in rollout.sequences()]
out["compiled"] = engine.compile_counts()
print(json.dumps(out))
"""


@pytest.fixture(scope="module", autouse=True)
def sharded_run(request):
    """SHARDED on 8 devices, started in the background when the module's first test runs (when
    the test that reads it is selected), so that it runs beside the in-process tests."""
    if not devices.selected(request, test_eight_devices_shard_every_parameter_kind_and_match):
        yield None
        return
    path, torch_model = request.getfixturevalue("checkpoints")["qwen35_mixed"]
    ps = prompts(torch_model.config.vocab_size, PROMPT_LENGTHS)
    argv = f"import sys; sys.argv = ['x', {path!r}, {json.dumps(ps)!r}, '{NEW_TOKENS}']\n"
    started = devices.in_background(devices.run_with_devices, argv + SHARDED)
    yield started
    started.cancel()


def test_eight_devices_shard_every_parameter_kind_and_match(
    checkpoints, greedy_references, sharded_run
):
    """On a 4 x 2 (data x tensor) mesh: the rules' layouts for every new parameter kind, torch's
    logits (the float32 and bfloat16 tolerances above) and a two-turn rollout whose rows park
    and rejoin (SHARDED): turn 1 is transformers' greedy continuation, every sampled token of
    both turns is the argmax, and its log-prob the log-softmax, of a teacher-forced pass over
    the finished row, and every cache entry of every cache carried between turns (the parked
    one too) is laid out as the engine's rules say."""
    path, torch_model = checkpoints["qwen35_mixed"]
    result = json.loads(sharded_run.result().splitlines()[-1])
    specs = result["specs"]
    attn, lin = "layers/l1/self_attn", "layers/l0/linear_attn"
    assert specs[f"{attn}/q_proj/kernel"] == [None, "fsdp", "tensor"]
    assert specs[f"{attn}/q_norm/scale"] == [None, None]
    for name in ("in_proj_qkv", "in_proj_z", "in_proj_a", "in_proj_b"):
        assert specs[f"{lin}/{name}/kernel"] == [None, "fsdp", None]
    assert specs[f"{lin}/out_proj/kernel"] == [None, None, "fsdp"]
    assert specs[f"{lin}/conv1d/weight"] == [None, None, None, None]
    assert specs[f"{lin}/A_log"] == specs[f"{lin}/dt_bias"] == [None, None]
    assert specs[f"{lin}/norm/scale"] == [None, None]
    ids, positions, mask = hf_models.padded_batch(torch_model.config.vocab_size)
    expected = hf_models.torch_logits(torch_model, ids, positions, mask)
    valid = mask.astype(bool)
    for dtype, tol in (("float32", 1e-4), ("bfloat16", 0.2)):
        got = np.asarray(result["logits"][dtype])
        assert np.abs(got[valid] - expected[valid]).max() <= tol
    # The rows were compacted (batches of 8 and 4) and parked: two caches after turn 1.
    assert result["compiled"]["decode"] == result["compiled"]["prefill"] == 2
    assert [len(caches) for caches in result["caches"]] == [2, 1]
    rows, kv = ["data", "fsdp"], [None, ["data", "fsdp"], "tensor", None, None]
    layout = {"k": kv, "v": kv, "conv": [None, rows, None, None], "mask": [rows, None]}
    layout.update(state=[None, rows, None, None, None], index=[rows])
    assert all(cache == layout for caches in result["caches"] for cache in caches)
    first, second = ({int(r): t for r, t in turn.items()} for turn in result["turns"])
    env = {int(r): e for r, e in result["env"].items()}
    assert sorted(first) == list(range(8)) and sorted(second) == [0, 2, 3, 5]
    budgets = {0: 2, 2: 1, 4: 3, 5: 2}
    for r in range(8):
        assert first[r] == greedy_references[r // 4][: budgets.get(r, NEW_TOKENS)]
    assert [len(second[r]) for r in (0, 2, 3, 5)] == [2, NEW_TOKENS, NEW_TOKENS, NEW_TOKENS]
    sequences = result["sequences"]
    ps = prompts(torch_model.config.vocab_size, PROMPT_LENGTHS)
    for r, seq in enumerate(sequences):
        parts = [(ps[r // 4], False), (first[r], True)]
        if r in second:
            parts += [(env[r], False), (second[r], True)]
        assert seq["token_ids"] == [i for ids, _ in parts for i in ids]
        assert seq["loss_mask"] == [m for ids, m in parts for _ in ids]
    # Teacher forcing in batches of 4 rows x 32: the float32 parity test's compiled program.
    model = _with_chunk(load_hf_checkpoint(path), 4)
    for batch in (sequences[:4], sequences[4:]):
        ids = np.zeros((4, 32), np.int32)
        for i, seq in enumerate(batch):
            ids[i, : len(seq["token_ids"])] = seq["token_ids"]
        positions = np.broadcast_to(np.arange(32), ids.shape)
        real = positions < np.asarray([[len(seq["token_ids"])] for seq in batch])
        logits, _ = _logits(model.params, model.config, ids, positions, real)
        for i, seq in enumerate(batch):
            n = len(seq["token_ids"])
            target, on = ids[i, 1:n], np.asarray(seq["loss_mask"][1:])
            policy = np.asarray(jax.nn.log_softmax(logits[i, : n - 1]))[np.arange(n - 1), target]
            np.testing.assert_array_equal(target[on], logits[i, : n - 1].argmax(-1)[on])
            got = np.asarray(seq["policy_logprobs"][1:])
            np.testing.assert_allclose(got[on], policy[on], atol=1e-4)


def test_compile_mode_reports_every_program_of_qwen35(checkpoints, tmp_path):
    """`run.py --mode=compile` on a Qwen3.5 checkpoint, 8 simulated CPU devices, from its
    config.json alone: every program of a step (continuous batching's too) compiles and is
    reported with its memory per device, and the resident cache is the full layers' KV plus the
    linear layers' states, as `estimate.cache_bytes_per_row` counts them."""
    from seal_jax import estimate
    from seal_jax.models.config import architecture_from_dir

    path, _ = checkpoints["qwen35_mixed"]
    workdir = tmp_path / "w"
    cmd = [
        sys.executable,
        os.path.join(REPO, "run.py"),
        "--config=configs/tiny.py",  # a 1,024-token context, float32 compute
        f"--config.model.path={path}",
        "--config.model.scratch.enabled=false",
        "--config.sft.steps=0",
        "--config.mesh.data=1",
        "--config.mesh.fsdp=-1",
        "--config.rollout.slots=16",
        "--config.compilation_cache_dir=",
        f"--workdir={workdir}",
        "--mode=compile",
    ]
    proc = subprocess.run(
        cmd, cwd=REPO, env=cpu_env(8, TEST_XLA_FLAGS), capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((workdir / "compile.json").read_text())
    names = [p["name"] for p in report["programs"]]
    rollout = ["rollout_prefill", "rollout_decode", "rollout_prefill_rows"]
    rollout += ["rollout_decode_rows", "rollout_copy_rows"]
    assert names == ["update_micro_step", "logprob_pass", *rollout]
    assert report["fits"] and report["chips"] == 8
    for program in report["programs"]:
        assert 0 < program["peak_bytes_per_chip"] <= report["hbm_bytes_per_chip"], program
        assert program["peak_bytes_per_chip"] >= program["argument_bytes"] + program["temp_bytes"]
    # 16 slots of 1,024 positions over 8 devices: 2 rows per device, float32 cache.
    row = estimate.cache_bytes_per_row(architecture_from_dir(path), 1024, dtype_bytes=4)
    assert row["state"] > 0 and row["conv"] > 0
    assert report["resident_bytes_per_chip"]["kv_cache"] == 2 * sum(row.values())
    assert "rollout_decode" in proc.stdout and "peak" in proc.stdout
    assert not (workdir / "warm_start").exists()  # no weights trained or loaded
