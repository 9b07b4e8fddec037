"""Sampling rules against a NumPy re-derivation: filtered distributions, draws and log-probs."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from seal_jax.sampler import SamplingParams, filtered_logits, sample


def numpy_distribution(logits, temperature, top_k, top_p):
    """Probabilities of the sampled distribution, derived independently of the implementation."""
    x = np.asarray(logits, np.float64) / temperature
    order = np.argsort(-x, kind="stable")
    keep = np.zeros(x.shape, bool)
    keep[order[: top_k or len(x)]] = True
    p = np.exp(x - x[keep].max()) * keep
    p /= p.sum()
    mass = 0.0
    nucleus = np.zeros(x.shape, bool)
    for i in order[: keep.sum()]:  # smallest prefix of the ranking with mass >= top_p
        nucleus[i] = True
        mass += p[i]
        if mass >= top_p:
            break
    p = p * nucleus
    return p / p.sum()


SETTINGS = [(1.0, 0, 1.0), (0.7, 0, 1.0), (1.3, 5, 1.0), (1.0, 0, 0.8), (0.8, 10, 0.6)]


@pytest.mark.parametrize("temperature,top_k,top_p", SETTINGS)
def test_filtered_distribution_matches_numpy(temperature, top_k, top_p):
    logits = np.random.default_rng(1).normal(size=(4, 40)).astype(np.float32) * 2
    params = SamplingParams("sample", temperature, top_k, top_p)
    got = np.asarray(jax.nn.softmax(filtered_logits(jnp.asarray(logits), params), axis=-1))
    for row in range(4):
        want = numpy_distribution(logits[row], temperature, top_k, top_p)
        np.testing.assert_allclose(got[row], want, atol=1e-6)


@pytest.mark.parametrize("temperature,top_k,top_p", [(0.7, 0, 1.0), (1.0, 3, 1.0), (1.0, 0, 0.7)])
def test_draws_follow_the_distribution_and_logprobs_are_exact(temperature, top_k, top_p):
    logits = np.asarray([1.5, 1.0, 0.3, 0.2, -0.5, -1.0, 0.9, 0.0], np.float32)
    n = 20000
    params = SamplingParams("sample", temperature, top_k, top_p)
    keys = jax.random.split(jax.random.key(0), n)
    ids, logprob, raw = sample(jnp.tile(logits, (n, 1)), keys, jnp.zeros(n, jnp.int32), params)
    ids = np.asarray(ids)
    want = numpy_distribution(logits, temperature, top_k, top_p)
    freq = np.bincount(ids, minlength=len(logits)) / n
    # Binomial standard error is <= 0.0036 at n = 20000: allow ~4.5 sigma, no mass off-support.
    assert np.abs(freq - want).max() < 0.016
    assert freq[want == 0].sum() == 0
    np.testing.assert_allclose(np.asarray(logprob), np.log(want[ids]), atol=1e-5)
    raw_want = logits - np.log(np.exp(logits.astype(np.float64)).sum())
    np.testing.assert_allclose(np.asarray(raw), raw_want[ids], atol=1e-5)


def test_greedy_is_argmax_with_point_mass_logprob():
    logits = np.random.default_rng(2).normal(size=(5, 30)).astype(np.float32)
    keys = jax.random.split(jax.random.key(0), 5)
    ids, logprob, raw = sample(jnp.asarray(logits), keys, jnp.arange(5), SamplingParams("greedy"))
    np.testing.assert_array_equal(np.asarray(ids), logits.argmax(-1))
    assert np.all(np.asarray(logprob) == 0)
    logz = np.log(np.exp(logits.astype(np.float64)).sum(-1))
    np.testing.assert_allclose(np.asarray(raw), logits.max(-1) - logz, atol=1e-5)


def test_a_row_draw_depends_only_on_its_key_and_position():
    logits = jnp.asarray(np.random.default_rng(3).normal(size=(3, 50)), jnp.float32)
    keys = jax.random.split(jax.random.key(7), 3)
    pos = jnp.asarray([4, 9, 2], jnp.int32)
    params = SamplingParams()
    ids, _, _ = sample(logits, keys, pos, params)
    flipped, _, _ = sample(logits[::-1], keys[::-1], pos[::-1], params)
    np.testing.assert_array_equal(np.asarray(ids), np.asarray(flipped)[::-1])


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (dict(mode="beam"), "unknown sampling mode"),
        (dict(temperature=0.0), "temperature"),
        (dict(top_k=-1), "top_k"),
        (dict(top_p=0.0), "top_p"),
    ],
)
def test_bad_settings_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SamplingParams(**kwargs)
