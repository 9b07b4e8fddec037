"""Chunked token log-probs against torch, remat gradients, and no [B, T, V] intermediate."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import torch
from jax.extend import core as jax_core

from seal_jax.models import load_hf_checkpoint, token_logprobs
from tests import hf_models


def _inputs(vocab):
    ids, positions, mask = hf_models.padded_batch(vocab)
    targets = np.roll(ids, -1, axis=1)
    return ids, positions, mask, targets


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

    def loss(params, attn_chunk):
        logp, _ = token_logprobs(
            params, model.config, ids, positions, mask, targets, attn_chunk=attn_chunk
        )
        return jnp.sum(logp * mask), logp

    (_, whole), g_whole = jax.value_and_grad(loss, has_aux=True)(model.params, 1024)
    (_, chunked), g_chunked = jax.value_and_grad(loss, has_aux=True)(model.params, 5)
    valid = mask.astype(bool)
    np.testing.assert_allclose(np.asarray(chunked)[valid], np.asarray(whole)[valid], atol=1e-5)
    for a, b in zip(jax.tree.leaves(g_whole), jax.tree.leaves(g_chunked)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5, rtol=1e-4)
