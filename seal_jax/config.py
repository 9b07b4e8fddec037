"""Validation of a resolved experiment config: one clear error for a value that cannot work.

The allowed values of each choice come from the module that defines them.
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp

from environments import diagnosis, episode, interface, rendering, rewards, sources
from environments.bfcl import tasks as bfcl_tasks
from environments.toolcall import TOOL_FORMATS
from seal_jax import chat, optim, rl

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
    if c.model.logprob_chunk <= 0 or c.model.attn_chunk <= 0 or c.model.mlp_chunk < 0:
        raise ConfigError(
            "--config.model.logprob_chunk and attn_chunk must be positive, mlp_chunk >= 0"
        )
    _choice(c.model.attention, "model.attention", ("auto", "xla", "splash"))
    _choice(c.model.chat_format, "model.chat_format", chat.CHAT_FORMATS)
    _choice(c.model.tool_format, "model.tool_format", ("auto", *TOOL_FORMATS))
    if c.model.scan_unroll < 1:
        raise ConfigError(f"--config.model.scan_unroll={c.model.scan_unroll}: use 1 or more")
    for axis in ("data", "fsdp", "tensor"):
        size = c.mesh[axis]
        if size == 0 or size < -1:
            raise ConfigError(f"--config.mesh.{axis}={size}: use a positive size or -1")
    _choice(c.optim.schedule, "optim.schedule", optim.SCHEDULES)
    _choice(c.optim.mu_dtype, "optim.mu_dtype", tuple(DTYPES))
    _check_bf16_updates(c)
    _choice(c.rl.kl_estimator, "rl.kl_estimator", rl.KL_ESTIMATORS)
    _choice(c.rl.loss_agg, "rl.loss_agg", rl.LOSS_AGGS)
    _choice(c.rl.old_logprobs, "rl.old_logprobs", rl.OLD_LOGPROBS)
    _choice(c.weighting.mode, "weighting.mode", rl.WEIGHT_MODES)
    _choice(c.rl.reward, "rl.reward", rewards.REWARD_KINDS)
    _choice(c.env.name, "env.name", tuple(sources.SOURCES))
    _choice(c.env.bfcl_split, "env.bfcl_split", bfcl_tasks.SPLITS)
    _choice(c.env.train_mode, "env.train_mode", episode.MODES)
    _choice(c.env.instance_mismatch, "env.instance_mismatch", diagnosis.INSTANCE_RULES)
    _choice(c.interface.prompt_style, "interface.prompt_style", rendering.PROMPT_STYLES)
    for component in interface.COMPONENTS:
        _choice(c.interface[component], f"interface.{component}", interface.MODES)
    _check_eval_protocols(c.train.eval_protocols)
    _positive(
        c,
        "rl.group_size",
        "train.batch_tasks",
        "train.mini_batch_tasks",
        "train.ppo_epochs",
        "optim.grad_accum",
        "env.num_workers",
        "env.max_model_calls",
        "rollout.max_new_tokens",
        "train.length_bucket",
        "train.keep_checkpoints",
    )
    if c.train.batch_tasks % c.train.mini_batch_tasks:
        raise ConfigError(
            f"--config.train.mini_batch_tasks={c.train.mini_batch_tasks} must divide "
            f"--config.train.batch_tasks={c.train.batch_tasks}"
        )
    rows = c.train.mini_batch_tasks * c.rl.group_size
    if rows % c.optim.grad_accum:
        raise ConfigError(
            f"a mini-batch of {rows} rollouts (train.mini_batch_tasks x rl.group_size) does not "
            f"split into --config.optim.grad_accum={c.optim.grad_accum} micro-batches"
        )
    if c.env.worker_timeout_s <= 0 or c.env.worker_memory_mb < 0:
        raise ConfigError(
            f"--config.env.worker_timeout_s={c.env.worker_timeout_s} must be positive and "
            f"--config.env.worker_memory_mb={c.env.worker_memory_mb} >= 0 (0: no limit)"
        )
    if c.rollout.slots < 0:
        raise ConfigError(f"--config.rollout.slots={c.rollout.slots}: use 0 (lockstep) or more")
    if c.train.max_response_tokens < 0:
        raise ConfigError(
            f"--config.train.max_response_tokens={c.train.max_response_tokens}: use 0 (no cap) "
            "or a positive token count"
        )
    if not 0.0 <= c.sft.all_token_fraction <= 1.0:
        raise ConfigError(
            f"--config.sft.all_token_fraction={c.sft.all_token_fraction}: use 0.0 to 1.0"
        )
    for key in ("rollout.max_new_tokens", "train.eval_max_new_tokens"):
        section, field = key.split(".")
        if c[section][field] >= c.rollout.context_limit:
            raise ConfigError(f"--config.{key} must be below rollout.context_limit")


# Typical magnitude of a weight (the normal(0.02) initialisation of Qwen-family checkpoints).
TYPICAL_WEIGHT = 0.02


def smallest_bf16_step(magnitude: float = TYPICAL_WEIGHT) -> float:
    """The smallest change bfloat16 keeps on a weight of `magnitude`: half its spacing there."""
    x = jnp.asarray(magnitude, jnp.bfloat16)
    return float(jnp.nextafter(x, jnp.asarray(1.0, jnp.bfloat16)) - x) / 2


def _check_bf16_updates(c: Any) -> None:
    """Refuses bfloat16 parameters under a learning rate whose Adam steps (about lr per weight)
    bfloat16 rounds away: with lr 1e-6, about 98% of N(0, 0.02) weights would never change."""
    if c.model.param_dtype != "bfloat16":
        return
    step = smallest_bf16_step()
    if c.optim.lr < step:
        raise ConfigError(
            "--config.model.param_dtype=bfloat16 cannot learn at "
            f"--config.optim.lr={c.optim.lr:g}: bfloat16 rounds away any change below "
            f"{step:.2g} of a weight of magnitude {TYPICAL_WEIGHT}; keep float32 parameters "
            "(fp32 master weights, bfloat16 compute; --config.optim.mu_dtype=bfloat16 saves "
            "optimizer memory) or raise the lr"
        )


def _check_eval_protocols(protocols: Any) -> None:
    """At least one evaluation protocol, each known and named once."""
    names = list(protocols)
    for name in names:
        _choice(name, "train.eval_protocols", episode.PROTOCOLS)
    if not names or len(set(names)) != len(names):
        raise ConfigError(
            f"--config.train.eval_protocols={protocols!r}: name each of "
            f"{', '.join(episode.PROTOCOLS)} at most once, at least one"
        )


def _positive(c: Any, *keys: str) -> None:
    for key in keys:
        section, field = key.split(".")
        if c[section][field] < 1:
            raise ConfigError(f"--config.{key}={c[section][field]} must be >= 1")
