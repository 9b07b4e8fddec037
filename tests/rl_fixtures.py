"""A tiny self-contained policy (embedding + linear softmax) and RL batches for the objective tests.

Shared by tests/test_rl.py and the multi-device checks it runs in a subprocess.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from configs.base import base_config
from seal_jax import rl

VOCAB, DIM = 16, 8


def init_params(seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    return {
        "embed": jnp.asarray(rng.normal(size=(VOCAB, DIM)), jnp.float32),
        "out": jnp.asarray(rng.normal(size=(DIM, VOCAB)) / np.sqrt(DIM), jnp.float32),
    }


def logits(params, input_ids, positions):
    hidden = params["embed"][input_ids] * (1.0 + 0.1 * positions[..., None])
    return hidden @ params["out"]


def logprob_fn(params, input_ids, positions, mask, targets):
    del mask  # each token's prediction depends on that token only
    logp = jax.nn.log_softmax(logits(params, input_ids, positions))
    return jnp.take_along_axis(logp, targets[..., None], axis=-1)[..., 0]


def logprob_entropy_fn(params, input_ids, positions, mask, targets):
    logp = jax.nn.log_softmax(logits(params, input_ids, positions))
    entropy = -jnp.sum(jnp.exp(logp) * logp, axis=-1)
    return logprob_fn(params, input_ids, positions, mask, targets), entropy


def make_batch(seed: int = 0, rows: int = 16, length: int = 12, group_size: int = 4) -> dict:
    """Host arrays: rows of varying length, a prompt, model tokens, noisy old/ref log-probs."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, VOCAB, size=(rows, length + 1))
    lengths = rng.integers(length // 2, length + 1, size=rows)
    lengths[-1] = 1  # a row with no model token at all
    mask = np.arange(length)[None, :] < lengths[:, None]
    prompt = rng.integers(1, 4, size=rows)
    loss_mask = (
        mask & (np.arange(length)[None, :] >= prompt[:, None]) & (rng.random(mask.shape) < 0.8)
    )
    positions = np.broadcast_to(np.arange(length), (rows, length)).astype(np.int32)
    current = np.asarray(logprob_fn(init_params(), ids[:, :-1], positions, mask, ids[:, 1:]))
    rewards = rng.integers(0, 2, size=rows).astype(np.float32)
    rewards[:group_size] = 1.0  # one all-equal group
    weights = rng.uniform(0.5, 2.0, size=rows).astype(np.float32)
    return {
        "input_ids": ids[:, :-1].astype(np.int32),
        "positions": positions,
        "mask": mask,
        "targets": ids[:, 1:].astype(np.int32),
        "loss_mask": loss_mask,
        "old_logprobs": (current + rng.normal(scale=0.3, size=current.shape)).astype(np.float32),
        "ref_logprobs": (current + rng.normal(scale=0.3, size=current.shape)).astype(np.float32),
        "rewards": rewards,
        "group_ids": np.repeat(np.arange(rows // group_size), group_size).astype(np.int32),
        "weights": weights,
    }


def rl_config(**overrides) -> ml_collections.ConfigDict:
    config = base_config().rl
    config.kl_coef = 0.1
    config.entropy_coef = 0.01
    config.update(overrides)
    return config


def optim_config(**overrides) -> ml_collections.ConfigDict:
    config = base_config().optim
    config.lr = 1e-2
    config.update(overrides)
    return config


def training_batch(seed: int = 0, **kwargs) -> dict:
    """`make_batch` with weighted GRPO advantages, keeping only the keys of the loss's batch."""
    raw = make_batch(seed, **kwargs)
    advantages = rl.grpo_advantages(raw["rewards"], raw["group_ids"])
    batch = {k: v for k, v in raw.items() if k not in ("rewards", "group_ids", "weights")}
    batch["advantages"] = np.asarray(rl.weighted_advantages(advantages, raw["weights"]))
    return batch
