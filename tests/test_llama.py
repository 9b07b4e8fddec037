"""The Llama 3 architecture against transformers: RoPE with llama3 scaling past the original
context, float32 and bfloat16 logits, greedy rollouts and cached multi-turn continuation, and the
config fields it reads or refuses. (Parity at short positions and export round trips run for
the llama variants in test_model_parity.py and test_checkpoint_io.py.)"""

import dataclasses
import json
import os
import shutil

import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from seal_jax.models import (
    CheckpointError,
    Llama3RopeScaling,
    QwenConfig,
    forward_logits,
    init_cache,
    load_hf_checkpoint,
)
from seal_jax.models.layers import rope_frequencies
from tests import hf_models
from tests.devices import run_with_devices
from tests.test_model_parity import SHARDED
from tests.test_rollout import engine, prompts

LLAMAS = ["llama", "llama31"]
# Positions well past the llama3 variant's original_max_position_embeddings (64).
FAR = 300


def _far_batch(vocab_size):
    ids, positions, mask = hf_models.padded_batch(vocab_size)
    return ids, positions + FAR, mask


@pytest.mark.parametrize("variant", LLAMAS)
def test_logits_past_the_original_context_match_torch(tiny_checkpoints, variant):
    """Same tolerances as the Qwen parity tests (test_model_parity.py)."""
    path, torch_model = tiny_checkpoints[variant]
    ids, positions, mask = _far_batch(torch_model.config.vocab_size)
    expected = hf_models.torch_logits(torch_model, ids, positions, mask)
    valid = mask.astype(bool)
    got = np.asarray(load_hf_checkpoint(path).logits(ids, positions, mask))
    assert np.abs(got[valid] - expected[valid]).max() <= 1e-4
    bf16 = load_hf_checkpoint(path, dtype=jnp.bfloat16, compute_dtype=jnp.bfloat16)
    got = np.asarray(bf16.logits(ids, positions, mask))
    diff = np.abs(got[valid] - expected[valid])
    assert diff.max() <= 0.1 and diff.mean() <= 0.02 and diff.max() > 1e-4
    assert (got.argmax(-1) == expected.argmax(-1))[valid].mean() >= 0.9


def test_sharded_4x2_mesh_matches_torch(tiny_checkpoints, tmp_path):
    """The partition rules shard Llama's parameters as Qwen's (test_model_parity.py)."""
    path, torch_model = tiny_checkpoints["llama31"]
    ids, positions, mask = hf_models.padded_batch(torch_model.config.vocab_size)
    expected = hf_models.torch_logits(torch_model, ids, positions, mask)
    valid = mask.astype(bool)
    for dtype, tol in (("float32", 1e-4), ("bfloat16", 0.1)):
        out = tmp_path / f"{dtype}.npy"
        code = f"import sys; sys.argv = ['x', {path!r}, {dtype!r}, {str(out)!r}]\n" + SHARDED
        run_with_devices(code, num_devices=8)
        assert np.abs(np.load(out)[valid] - expected[valid]).max() <= tol


def test_llama3_scaling_is_read_and_matters(tiny_checkpoints):
    path, torch_model = tiny_checkpoints["llama31"]
    model = load_hf_checkpoint(path)
    cfg = model.config
    assert cfg.rope_scaling == Llama3RopeScaling(8.0, 1.0, 4.0, 64)
    assert (cfg.model_type, cfg.qkv_bias, cfg.qk_norm, cfg.tie_word_embeddings) == (
        "llama",
        False,
        False,
        False,
    )
    ids, positions, mask = _far_batch(torch_model.config.vocab_size)
    expected = hf_models.torch_logits(torch_model, ids, positions, mask)
    unscaled = dataclasses.replace(cfg, rope_scaling=None)
    got, _ = forward_logits(model.params, unscaled, ids, positions, mask)
    valid = mask.astype(bool)
    assert np.abs(np.asarray(got)[valid] - expected[valid]).max() > 0.01


@pytest.mark.parametrize(
    "head_dim, theta, original",
    [(16, 5000.0, 64), (128, 500000.0, 8192)],  # the tiny model's; Llama-3.1-8B's
)
def test_rope_frequencies_are_transformers_llama3_frequencies(head_dim, theta, original):
    rope = {
        **hf_models.LLAMA3_ROPE,
        "rope_theta": theta,
        "original_max_position_embeddings": original,
    }
    config = transformers.LlamaConfig(
        hidden_size=4 * head_dim,
        num_attention_heads=4,
        head_dim=head_dim,
        max_position_embeddings=16 * original,
        rope_parameters=rope,
    )
    reference, _ = ROPE_INIT_FUNCTIONS["llama3"](config, "cpu")
    ours = np.asarray(rope_frequencies(QwenConfig.from_hf_dict(config.to_dict())))
    # The same float32 operations in the same order; XLA's pow may differ by an ulp or two.
    np.testing.assert_allclose(ours, reference.numpy(), rtol=1e-6, atol=0)


def test_v4_rope_scaling_field_is_read():
    """Meta's Llama-3.1 config.json carries `rope_scaling` (transformers v4) and `rope_theta`."""
    d = hf_models.tiny_config("llama").to_dict()
    d.pop("rope_parameters")
    d["rope_theta"] = 500000.0
    d["rope_scaling"] = {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    }
    cfg = QwenConfig.from_hf_dict(d)
    assert cfg.rope_theta == 500000.0 and cfg.rope_scaling == Llama3RopeScaling(8.0, 1.0, 4.0, 8192)


@pytest.mark.parametrize(
    "edit, message",
    [
        ({"attention_bias": True}, "attention_bias=true is not supported for llama"),
        ({"mlp_bias": True}, "mlp_bias=true is not supported"),
        ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4, "factor": 2.0}}, "yarn"),
        (
            {"rope_parameters": {"rope_type": "llama3", "rope_theta": 1e4, "factor": 8.0}},
            "lacks 'low_freq_factor'",
        ),
    ],
)
def test_unsupported_llama_fields_are_refused(tiny_checkpoints, tmp_path, edit, message):
    out = str(tmp_path / "c")
    shutil.copytree(tiny_checkpoints["llama"][0], out)
    with open(os.path.join(out, "config.json")) as f:
        cfg = json.load(f)
    cfg.update(edit)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(cfg, f)
    with pytest.raises(CheckpointError, match=message):
        load_hf_checkpoint(out)


def hf_greedy(torch_model, prompt, n):
    """transformers' greedy continuation; the mask is explicit because generate() would mask
    every prompt token equal to pad_token_id (long random prompts hold some)."""
    ids = torch.tensor([prompt])
    with torch.no_grad():
        out = torch_model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=n,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
        )
    return out[0, len(prompt) :].tolist()


@pytest.mark.parametrize("variant", LLAMAS)
def test_greedy_rollout_matches_transformers_generate(tiny_checkpoints, variant):
    """Prompts of 70 and 66 tokens: the replies run past the original context of 64."""
    path, torch_model = tiny_checkpoints[variant]
    ps = prompts(torch_model.config.vocab_size, lengths=(70, 5, 66))
    references = [hf_greedy(torch_model, p, 10) for p in ps]
    eng, params = engine(path, stop_ids=(torch_model.config.vocab_size,))  # never sampled
    turns = eng.start(params, ps, num_samples=2).generate()
    assert [turns[r].ids for r in sorted(turns)] == [ref for ref in references for _ in range(2)]


def test_cached_multi_turn_continuation_equals_one_forward_pass(tiny_checkpoints):
    """Ragged chunks appended turn by turn to a per-row cache, crossing position 64, give
    torch's logits of one pass over each whole row."""
    path, torch_model = tiny_checkpoints["llama31"]
    model = load_hf_checkpoint(path)
    rng = np.random.default_rng(5)
    chunk_lengths = [(40, 9), (30, 50), (6, 21)]  # (row 0, row 1) per turn
    rows, got = [[], []], [[], []]
    cache = init_cache(model.config, 2, 96, per_row=True)
    for lengths in chunk_lengths:
        width = max(lengths) + 2
        ids = np.zeros((2, width), np.int32)
        for b, n in enumerate(lengths):
            ids[b, :n] = rng.integers(0, model.config.vocab_size, n)
        positions = np.asarray([[len(r)] for r in rows]) + np.arange(width)
        mask = np.arange(width) < np.asarray(lengths)[:, None]
        logits, cache = forward_logits(model.params, model.config, ids, positions, mask, cache)
        for b, n in enumerate(lengths):
            rows[b] += ids[b, :n].tolist()
            got[b].append(np.asarray(logits[b, :n]))
    for b in range(2):
        seq = np.asarray([rows[b]])
        want = hf_models.torch_logits(
            torch_model, seq, np.arange(seq.shape[1])[None], np.ones_like(seq)
        )
        assert np.abs(np.concatenate(got[b]) - want[0]).max() <= 1e-4
    assert np.asarray(cache["index"]).tolist() == [76, 80]
