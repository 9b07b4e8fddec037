"""Validation of a resolved experiment config: one clear error for a value that cannot work."""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}


class ConfigError(ValueError):
    """A config value that cannot work, with the dotted key and what to do."""


def _choice(value: Any, key: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ConfigError(f"--config.{key}={value!r}: must be one of {', '.join(allowed)}")


def dtype(name: str) -> Any:
    """The jnp dtype named in the config ('float32' or 'bfloat16')."""
    return DTYPES[name]


def validate(c: Any) -> None:
    """Raises ConfigError for the first invalid field of config `c` (a ConfigDict)."""
    _choice(c.model.param_dtype, "model.param_dtype", tuple(DTYPES))
    _choice(c.model.compute_dtype, "model.compute_dtype", tuple(DTYPES))
    if c.model.logprob_chunk <= 0:
        raise ConfigError("--config.model.logprob_chunk must be positive")
    for axis in ("data", "fsdp", "tensor"):
        size = c.mesh[axis]
        if size == 0 or size < -1:
            raise ConfigError(f"--config.mesh.{axis}={size}: use a positive size or -1")
    _choice(c.optim.schedule, "optim.schedule", ("constant", "cosine", "linear"))
    _choice(c.rl.kl_estimator, "rl.kl_estimator", ("k1", "k2", "k3"))
    _choice(
        c.rl.loss_agg,
        "rl.loss_agg",
        ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"),
    )
    _choice(c.weighting.mode, "weighting.mode", ("all", "positive", "negative"))
    if c.rl.group_size < 1:
        raise ConfigError("--config.rl.group_size must be >= 1")
