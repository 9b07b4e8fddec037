"""Chunked token log-probs against torch, remat gradients, and no [B, T, V] intermediate."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from jax.extend import core as jax_core

from seal_jax.models import load_hf_checkpoint, token_logprobs
from seal_jax.models.layers import CAUSAL_BLOCK
from tests import hf_models


def _inputs(vocab):
    ids, positions, mask = hf_models.padded_batch(vocab)
    targets = np.roll(ids, -1, axis=1)
    return ids, positions, mask, targets


def _logprobs_and_grads(model, ids, positions, mask, targets, **options):
    """token_logprobs with options, and the gradient of their masked sum."""

    def loss(params):
        logp, _ = token_logprobs(params, model.config, ids, positions, mask, targets, **options)
        return jnp.sum(logp * mask), logp

    (_, logp), grads = jax.value_and_grad(loss, has_aux=True)(model.params)
    return logp, grads


def _assert_same(logp, grads, other_logp, other_grads, valid):
    """Two computations of the same log-probs (on valid tokens) and gradients agree."""
    np.testing.assert_allclose(np.asarray(other_logp)[valid], np.asarray(logp)[valid], atol=1e-5)
    for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(other_grads)):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), atol=1e-5, rtol=1e-4)


def test_chunked_logprobs_and_entropy_match_torch(tiny_checkpoints):
    path, torch_model = tiny_checkpoints["qwen2_tied"]
    ids, positions, mask, targets = _inputs(torch_model.config.vocab_size)
    logits = torch.tensor(hf_models.torch_logits(torch_model, ids, positions, mask))
    logp_all = torch.log_softmax(logits, -1)
    expected = logp_all.gather(-1, torch.tensor(targets)[..., None])[..., 0].numpy()
    expected_entropy = -(logp_all.exp() * logp_all).sum(-1).numpy()
    model = load_hf_checkpoint(path)
    logp, entropy = token_logprobs(
        model.params, model.config, ids, positions, mask, targets, chunk=5, with_entropy=True
    )
    valid = mask.astype(bool)
    assert np.abs(np.asarray(logp)[valid] - expected[valid]).max() <= 1e-4
    assert np.abs(np.asarray(entropy)[valid] - expected_entropy[valid]).max() <= 1e-4


def test_remat_gives_the_same_gradient(tiny_checkpoints):
    path, torch_model = tiny_checkpoints["qwen3"]
    ids, positions, mask, targets = _inputs(torch_model.config.vocab_size)
    model = load_hf_checkpoint(path)

    def loss(params, remat):
        logp, _ = token_logprobs(
            params, model.config, ids, positions, mask, targets, chunk=4, remat=remat
        )
        return jnp.sum(logp * mask)

    plain = jax.grad(functools.partial(loss, remat=False))(model.params)
    remat = jax.grad(functools.partial(loss, remat=True))(model.params)
    for a, b in zip(jax.tree.leaves(plain), jax.tree.leaves(remat)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5, rtol=1e-4)


def test_long_rows_match_torch_across_causal_blocks_and_unrolled_layers(tiny_checkpoints):
    """Rows longer than CAUSAL_BLOCK (whole blocks of padding on either side): the blocked
    causal attention gives torch's log-probs, and unrolling the layer scan changes nothing."""
    path, torch_model = tiny_checkpoints["qwen3"]
    t = 2 * CAUSAL_BLOCK + 44
    pads = ((CAUSAL_BLOCK + 2, 0), (0, CAUSAL_BLOCK + 12), (0, 0), (5, 7))
    ids, positions, mask = hf_models.padded_batch(torch_model.config.vocab_size, 3, t, pads)
    targets = np.roll(ids, -1, axis=1)
    logits = torch.tensor(hf_models.torch_logits(torch_model, ids, positions, mask))
    expected = torch.log_softmax(logits, -1).gather(-1, torch.tensor(targets)[..., None])[..., 0]
    model = load_hf_checkpoint(path)
    inputs = (ids, positions, mask, targets)
    scanned, g_scanned = _logprobs_and_grads(model, *inputs, scan_unroll=1)
    unrolled, g_unrolled = _logprobs_and_grads(model, *inputs, scan_unroll=2)
    valid = mask.astype(bool)
    assert np.abs(np.asarray(scanned)[valid] - expected.numpy()[valid]).max() <= 1e-4
    _assert_same(scanned, g_scanned, unrolled, g_unrolled, valid)


def _shapes_in(jaxpr):
    for eqn in jaxpr.eqns:
        for v in eqn.outvars:
            yield tuple(getattr(v.aval, "shape", ()))
    for sub in jax_core.subjaxprs(jaxpr):
        yield from _shapes_in(sub)


def test_no_full_vocab_logits_are_materialised(tiny_checkpoints):
    path, torch_model = tiny_checkpoints["qwen2_untied"]
    vocab = torch_model.config.vocab_size
    ids, positions, mask, targets = _inputs(vocab)
    model = load_hf_checkpoint(path)
    b, t = ids.shape

    def loss(params):
        logp, _ = token_logprobs(params, model.config, ids, positions, mask, targets, chunk=4)
        return jnp.sum(logp)

    shapes = set(_shapes_in(jax.make_jaxpr(jax.grad(loss))(model.params).jaxpr))
    assert (b, 4, vocab) in shapes  # one chunk of logits exists ...
    activations = [s for s in shapes if len(s) >= 3 and s[-1] == vocab]
    assert max(np.prod(s) for s in activations) == b * 4 * vocab < b * t * vocab


def test_query_chunked_attention_matches_one_block(tiny_checkpoints):
    path, torch_model = tiny_checkpoints["qwen3"]
    ids, positions, mask, targets = _inputs(torch_model.config.vocab_size)
    model = load_hf_checkpoint(path)
    inputs = (ids, positions, mask, targets)
    whole, g_whole = _logprobs_and_grads(model, *inputs, attn_chunk=1024)
    chunked, g_chunked = _logprobs_and_grads(model, *inputs, attn_chunk=5)
    _assert_same(whole, g_whole, chunked, g_chunked, mask.astype(bool))


def test_sequence_chunked_feed_forward_matches_the_whole_sequence(tiny_checkpoints):
    path, torch_model = tiny_checkpoints["qwen2_tied"]
    ids, positions, mask, targets = _inputs(torch_model.config.vocab_size)
    model = load_hf_checkpoint(path)
    inputs = (ids, positions, mask, targets)
    chunk = ids.shape[1] // 4
    assert chunk and ids.shape[1] % chunk == 0  # several chunks of the sequence
    whole, g_whole = _logprobs_and_grads(model, *inputs, remat=True)
    chunked, g_chunked = _logprobs_and_grads(model, *inputs, remat=True, mlp_chunk=chunk)
    _assert_same(whole, g_whole, chunked, g_chunked, mask.astype(bool))


@pytest.mark.parametrize("variant", ["qwen3", "qwen2_tied"])
def test_splash_kernel_matches_xla_attention(tiny_checkpoints, variant):
    """The Pallas splash kernel (in its interpreter here; compiled for TPU in the compile
    targets) gives XLA attention's log-probs and gradients on padded rows."""
    path, torch_model = tiny_checkpoints[variant]
    ids, positions, mask, targets = _inputs(torch_model.config.vocab_size)
    model = load_hf_checkpoint(path)
    inputs = (ids, positions, mask, targets)
    xla, g_xla = _logprobs_and_grads(model, *inputs, remat=True)
    kernel, g_kernel = _logprobs_and_grads(model, *inputs, remat=True, attention="splash_interpret")
    _assert_same(xla, g_xla, kernel, g_kernel, mask.astype(bool))


def _shared_prompt_batch(vocab, prompt_lengths=(7, 4), rows_per_prompt=3, width=16):
    """Whole sequences [B, width] and the same rows as prompts [G, P] plus continuations [B, T]."""
    rng = np.random.default_rng(1)
    b = len(prompt_lengths) * rows_per_prompt
    whole = {"ids": np.zeros((b, width), np.int32), "mask": np.zeros((b, width), bool)}
    p_width, t_width = max(prompt_lengths), width
    prompt = {"ids": np.zeros((len(prompt_lengths), p_width), np.int32)}
    prompt["mask"] = np.arange(p_width)[None, :] < np.asarray(prompt_lengths)[:, None] - 1
    rest = {"ids": np.zeros((b, t_width), np.int32), "mask": np.zeros((b, t_width), bool)}
    rest["positions"] = np.zeros((b, t_width), np.int32)
    starts = []
    for g, p_len in enumerate(prompt_lengths):
        shared = rng.integers(1, vocab, p_len)
        prompt["ids"][g, : p_len - 1] = shared[:-1]
        for r in range(rows_per_prompt):
            row = g * rows_per_prompt + r
            seq = np.concatenate([shared, rng.integers(1, vocab, rng.integers(2, width - p_len))])
            whole["ids"][row, : len(seq)], whole["mask"][row, : len(seq)] = seq, True
            tail = seq[p_len - 1 :]
            rest["ids"][row, : len(tail)], rest["mask"][row, : len(tail)] = tail, True
            rest["positions"][row] = p_len - 1 + np.arange(t_width)
            starts.append(p_len - 1)
    prompt["positions"] = np.broadcast_to(np.arange(p_width, dtype=np.int32), prompt["ids"].shape)
    return whole, prompt, rest, np.asarray(starts)


@pytest.mark.parametrize("width, attn_chunk", [(16, 3), (16, 1024), (2 * CAUSAL_BLOCK + 20, 1024)])
def test_shared_prompt_log_probs_and_gradients_match_whole_sequences(
    tiny_checkpoints, width, attn_chunk
):
    """Rows that share a prompt, the prompt run once per group: the same log-probs as torch on
    the whole sequences, and the same gradient as the plain forward (the group's gradient
    through the prompt is summed over its rows). Query chunks (attn_chunk 3), one causal block,
    and several causal blocks."""
    path, torch_model = tiny_checkpoints["qwen3"]
    vocab = torch_model.config.vocab_size
    whole, prompt, rest, starts = _shared_prompt_batch(vocab, width=width)
    b, width = whole["ids"].shape
    positions = np.broadcast_to(np.arange(width, dtype=np.int32), (b, width))
    logits = torch.tensor(
        hf_models.torch_logits(torch_model, whole["ids"], positions, whole["mask"])
    )
    targets = np.roll(whole["ids"], -1, axis=1)
    expected = torch.log_softmax(logits, -1).gather(-1, torch.tensor(targets)[..., None])[..., 0]
    rest_targets = np.roll(rest["ids"], -1, axis=1)
    # the same loss tokens in both layouts: every continuation id after the prompt's last one
    loss_whole = np.zeros((b, width), np.float32)
    loss_rest = (rest["mask"] & np.roll(rest["mask"], -1, axis=1)).astype(np.float32)
    for row, start in enumerate(starts):
        n = int(loss_rest[row].sum())
        loss_whole[row, start : start + n] = 1.0
    weights = np.random.default_rng(2).normal(size=(b, 1)).astype(np.float32)
    model = load_hf_checkpoint(path)
    shared = (prompt["ids"], prompt["positions"], prompt["mask"])

    def loss(params, is_shared):
        if is_shared:
            logp, _ = token_logprobs(
                params,
                model.config,
                rest["ids"],
                rest["positions"],
                rest["mask"],
                rest_targets,
                chunk=4,
                attn_chunk=attn_chunk,
                prompt=shared,
            )
            return jnp.sum(logp * loss_rest * weights), logp
        logp, _ = token_logprobs(
            params, model.config, whole["ids"], positions, whole["mask"], targets, chunk=4
        )
        return jnp.sum(logp * loss_whole * weights), logp

    (_, got), g_shared = jax.value_and_grad(loss, has_aux=True)(model.params, True)
    _, g_whole = jax.value_and_grad(loss, has_aux=True)(model.params, False)
    for row, start in enumerate(starts):
        n = int(loss_rest[row].sum())
        want = expected[row, start : start + n].numpy()
        np.testing.assert_allclose(np.asarray(got)[row, :n], want, atol=1e-4)
    # float32 sums in another order: embedding gradients of ~0.04 differ by up to ~1.5e-5
    for a, c in zip(jax.tree.leaves(g_whole), jax.tree.leaves(g_shared)):
        np.testing.assert_allclose(np.asarray(c), np.asarray(a), atol=3e-5, rtol=1e-4)
