"""Warm start: oracle transcripts equal the driver's token sequences; SFT learns the oracle."""

from __future__ import annotations

import functools
from types import SimpleNamespace

import jax
import numpy as np
import pytest

from environments.episode import Episode, EpisodeConfig
from environments.policies import oracle_turns
from environments.pool import EnvPool, PoolConfig
from environments.sources import get_source
from environments.suite import load_task, load_tasks
from seal_jax import modes, sft
from seal_jax import rollout as rollout_lib
from seal_jax.chat import ChatFormat
from seal_jax.episodes import generate_episodes
from seal_jax.models import forward_logits, load_hf_checkpoint
from tests.devices import run_with_devices

# One task per category, with multi-turn and reveal cases among them.
TASK_IDS = [
    "multi_turn_base_train-0",
    "multi_turn_miss_func_train-0",
    "multi_turn_miss_param_train-0",
    "multi_turn_long_context_train-0",
]


REFERENCE_LENGTH = 320  # warm-start tests use transcripts up to this long (one compile)


class _ScriptedRollout:
    """Stands in for the rollout engine: every row "samples" its queue of scripted replies."""

    def __init__(self, prompts: list[list[int]], replies: list[list[list[int]]]) -> None:
        self.tokens = [list(p) for p in prompts]
        self.sampled = [[False] * len(p) for p in prompts]
        self.prompt_lens = [len(p) for p in prompts]
        self.replies = [list(r) for r in replies]

    def generate(self, env_ids=None, max_new_tokens=None):
        rows = range(len(self.tokens)) if env_ids is None else sorted(env_ids)
        turns = {}
        for r in rows:
            extra = list(env_ids[r]) if env_ids is not None else []
            ids = self.replies[r].pop(0)
            self.tokens[r] += extra + ids
            self.sampled[r] += [False] * len(extra) + [True] * len(ids)
            zeros = np.zeros(len(ids), np.float32)
            turns[r] = rollout_lib.Turn(ids, zeros, zeros, rollout_lib.STOP)
        return turns

    def sequences(self):
        return [
            rollout_lib.TokenSequence(
                token_ids=np.asarray(tokens, np.int32),
                loss_mask=np.asarray(sampled, bool),
                sampling_logprobs=np.zeros(len(tokens), np.float32),
                policy_logprobs=np.zeros(len(tokens), np.float32),
                prompt_len=n,
                stop_reason=rollout_lib.STOP,
            )
            for tokens, sampled, n in zip(self.tokens, self.sampled, self.prompt_lens)
        ]


class _ScriptedEngine:
    config = SimpleNamespace(context_limit=4096, max_new_tokens=128)

    def __init__(self, replies: list[list[list[int]]]) -> None:
        self.replies = replies

    def start(self, params, prompts, num_samples, seed, first_row=0):
        assert num_samples == 1 and params is None
        return _ScriptedRollout(prompts, self.replies)


@pytest.fixture(scope="module")
def policy_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny_policy")
    sft.make_tiny_policy(path, hidden=32, layers=1, heads=2, kv_heads=1, intermediate=64, seed=0)
    return str(path)


@pytest.fixture(scope="module")
def chat(policy_dir):
    return ChatFormat(load_hf_checkpoint(policy_dir).tokenizer())


def _oracle_messages(task) -> list[str]:
    return [message for turn in oracle_turns(task) for message in turn]


def _runs(mask: np.ndarray) -> list[tuple[int, int]]:
    """(start, end) of every run of True in mask."""
    edges = np.flatnonzero(np.diff(np.concatenate([[0], mask.astype(np.int8), [0]])))
    return list(zip(edges[::2], edges[1::2]))


def test_transcripts_equal_the_driver_sequences_of_the_oracle(chat):
    tasks = [load_task(i) for i in TASK_IDS]
    transcripts = sft.oracle_transcripts(tasks, chat)
    replies = [[chat.encode(m) + [chat.end_of_turn_id] for m in _oracle_messages(t)] for t in tasks]
    pool_config = PoolConfig(num_workers=1, episode=EpisodeConfig(mode="training"))
    with EnvPool(load_task, pool_config) as pool:
        batch = generate_episodes(_ScriptedEngine(replies), None, chat, pool, TASK_IDS, 1, seed=0)
    assert [r.reward for r in batch.results] == [1.0] * len(TASK_IDS)
    for (ids, mask), driven in zip(transcripts, batch.sequences):
        np.testing.assert_array_equal(ids, driven.token_ids)
        np.testing.assert_array_equal(mask, driven.loss_mask)


def test_transcript_decodes_to_the_rendered_conversation_and_masks_only_replies(chat):
    for task_id in TASK_IDS:
        task = load_task(task_id)
        ids, mask = sft.oracle_transcript(task, chat)
        episode = Episode(task, EpisodeConfig(mode="training"))
        episode.reset()
        for message in _oracle_messages(task):
            episode.step(message)
        rendered = chat.render(episode.result().transcript)
        decoded = chat.tokenizer.decode(ids.tolist(), skip_special_tokens=False)
        assert decoded + "\n" == rendered  # the template closes the last turn with a newline
        spans = [
            chat.tokenizer.decode(ids[a:b].tolist(), skip_special_tokens=False)
            for a, b in _runs(mask)
        ]
        assert spans == [m + "<|im_end|>" for m in _oracle_messages(task)]
        assert _runs(mask)[0][0] == len(chat.prompt_ids(Episode(task).reset()))


def test_batch_targets_are_the_next_ids_masked_to_replies_or_to_all_ids(chat):
    transcripts = [sft.oracle_transcript(load_task(task_id), chat) for task_id in TASK_IDS[:2]]
    replies, whole = (sft.sft_batch(transcripts, 128, all_tokens) for all_tokens in (False, True))
    assert replies["input_ids"].shape[1] % 128 == 0
    for row, (ids, mask) in enumerate(transcripts):
        n = len(ids)
        np.testing.assert_array_equal(replies["targets"][row, : n - 1], ids[1:])
        np.testing.assert_array_equal(replies["loss_mask"][row, : n - 1], mask[1:])
        np.testing.assert_array_equal(whole["loss_mask"][row, : n - 1], True)
        assert (
            not replies["loss_mask"][row, n - 1 :].any()
            and not whole["loss_mask"][row, n - 1 :].any()
        )


def _reference_logprobs(params, cfg, ids: np.ndarray) -> np.ndarray:
    """log p(ids[t + 1] | ids[: t + 1]) from the full logits (not the chunked training path)."""
    logits = _full_logits(params, cfg, np.pad(ids, (0, REFERENCE_LENGTH - len(ids))))
    logp = jax.nn.log_softmax(np.asarray(logits[: len(ids) - 1], np.float64), axis=-1)
    return np.take_along_axis(np.asarray(logp), ids[1:, None], axis=-1)[:, 0]


@functools.lru_cache
def _logits_fn(cfg):
    """Jitted full logits of one causal row; padding at the end changes no earlier logit."""
    positions = np.arange(REFERENCE_LENGTH)[None]
    valid = np.ones((1, REFERENCE_LENGTH), bool)
    return jax.jit(
        lambda params, ids: forward_logits(params, cfg, ids[None], positions, valid)[0][0]
    )


def _full_logits(params, cfg, ids: np.ndarray) -> np.ndarray:
    return np.asarray(_logits_fn(cfg)(params, ids))


def _oracle_nll(params, cfg, transcripts) -> float:
    """Mean negative log-likelihood per assistant token."""
    total, count = 0.0, 0
    for ids, mask in transcripts:
        lp = _reference_logprobs(params, cfg, ids)
        total -= lp[mask[1:]].sum()
        count += mask[1:].sum()
    return total / count


def _first_reply_logprob(params, cfg, transcript) -> float:
    ids, mask = transcript
    start, end = _runs(mask)[0]
    return float(_reference_logprobs(params, cfg, ids)[start - 1 : end - 1].sum())


@pytest.fixture(scope="module")
def warm_started(policy_dir, chat):
    """Initial params, and the params of two warm starts with the same seed."""
    transcripts = sft.oracle_transcripts(load_tasks("train"), chat)
    transcripts = [t for t in transcripts if len(t[0]) <= REFERENCE_LENGTH][:6]
    kwargs = dict(steps=10, batch_size=2, lr=3e-2, seed=3, length_bucket=REFERENCE_LENGTH)
    model = load_hf_checkpoint(policy_dir)
    initial = jax.device_get(model.params)
    runs = []
    for _ in range(2):
        model = load_hf_checkpoint(policy_dir)
        params = sft.warm_start(model.params, model.config, model.mesh, transcripts, **kwargs)
        runs.append(jax.device_get(params))
    return model.config, transcripts, initial, runs


def test_warm_start_learns_the_oracle_replies(warm_started):
    cfg, transcripts, initial, (trained, _) = warm_started
    before, after = _oracle_nll(initial, cfg, transcripts), _oracle_nll(trained, cfg, transcripts)
    assert after < 0.75 * before, (before, after)
    for transcript in transcripts[:2]:
        assert _first_reply_logprob(trained, cfg, transcript) > _first_reply_logprob(
            initial, cfg, transcript
        )


def test_warm_start_is_deterministic(warm_started):
    _, _, initial, (first, second) = warm_started
    for a, b in zip(jax.tree.leaves(first), jax.tree.leaves(second)):
        np.testing.assert_array_equal(a, b)
    assert any(
        not np.array_equal(a, c) for a, c in zip(jax.tree.leaves(first), jax.tree.leaves(initial))
    )


def test_warm_start_refuses_bad_arguments(policy_dir, chat):
    model = load_hf_checkpoint(policy_dir)
    transcripts = sft.oracle_transcripts(load_tasks("train")[:1], chat)
    with pytest.raises(ValueError, match="batch size"):
        sft.warm_start(
            model.params,
            model.config,
            model.mesh,
            transcripts,
            steps=1,
            batch_size=0,
            lr=1e-3,
            seed=0,
        )
    with pytest.raises(ValueError, match="transcripts"):
        sft.warm_start(
            model.params, model.config, model.mesh, [], steps=1, batch_size=1, lr=1e-3, seed=0
        )


def test_tiny_policy_matches_the_tokenizer(policy_dir, chat):
    cfg = load_hf_checkpoint(policy_dir).config
    assert cfg.vocab_size == len(chat.tokenizer)
    assert (cfg.hidden_size, cfg.num_layers, cfg.num_heads, cfg.num_kv_heads) == (32, 1, 2, 1)
    assert cfg.hf_config["eos_token_id"] == chat.end_of_turn_id


_SHARDED_CODE = """
import jax, numpy as np
from seal_jax import sft, sharding
from seal_jax.models import QwenConfig, init_params

cfg = QwenConfig("qwen2", 50, 16, 32, 1, 2, 1, 8, 10000.0, 1e-6, True, False, True, 128)
rng = np.random.default_rng(0)
transcripts = [
    (rng.integers(0, 50, n).astype(np.int32), rng.random(n) < 0.5) for n in (20, 33, 40, 57)
]
results = []
for mesh in (sharding.make_mesh(1, 1, 1, jax.devices()[:1]), sharding.make_mesh(2, 1, 1)):
    shapes = jax.eval_shape(lambda: init_params(cfg, jax.random.key(0)))
    shardings = sharding.param_shardings(shapes, mesh)
    params = jax.jit(lambda: init_params(cfg, jax.random.key(0)), out_shardings=shardings)()
    params = sft.warm_start(
        params, cfg, mesh, transcripts, steps=3, batch_size=2, lr=1e-2, seed=0, length_bucket=32
    )
    results.append(jax.device_get(params))
for a, b in zip(*(jax.tree.leaves(r) for r in results)):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
print("same")
"""


def test_warm_start_on_two_devices_matches_one():
    assert run_with_devices(_SHARDED_CODE, num_devices=2).strip().endswith("same")


def test_warm_start_tasks_take_whole_categories_and_first_n_of_others():
    source = get_source("suite")
    train = source.split_ids("train")
    of = {c: [i for i in train if source.category_of(i) == c] for c in source.categories}
    ids = modes.warm_start_ids(("base", "miss_param:3"), source)
    assert ids == of["base"] + of["miss_param"][:3]
    assert modes.warm_start_ids((), source) == train
    assert modes.warm_start_ids(("long_context:1000",), source) == of["long_context"]


@pytest.mark.parametrize(
    ("variant", "flags", "cued"),
    [
        ("seal", {}, ()),  # configs/tiny.py: the plain interface only
        ("seal", {"schema_cues": "static"}, ("schema_cues",)),  # the released preset's cues
        ("closed_loop", {}, ("schema_cues", "affordance_cues", "error_hints", "guidelines")),
    ],
)
def test_warm_start_sees_every_text_its_training_interface_can_show(variant, flags, cued):
    """The warm start's views: plain, plus every unit of each component that training can
    show, adaptive ones included (the closed loop switches them on later)."""
    from configs.tiny import get_config
    from environments import interface

    config = get_config(variant)
    config.interface.update(flags)
    views = modes.warm_start_views(config)
    assert len(views) == 1 + bool(cued) and type(views[0]) is interface.Renderer
    if not cued:
        return
    system = views[1].system(load_task("multi_turn_miss_func_train-0").docs)["content"]
    assert (interface.INSTRUCTION in system) == ("schema_cues" in cued)
    assert (interface.AFFORDANCE_CUE in system) == ("affordance_cues" in cued)
    for tag, line in interface.GUIDELINES.items():
        assert (line in system) == ("guidelines" in cued), tag
    assert views[1].shows("error_hints", "not_found") == ("error_hints" in cued)
