"""The policy update of one SEAL step: one entry point, `update_policy`.

Given the step's rollout sequences and their (already weighted) advantages:
  rows        <- every row, or only the groups with a learning signal (rl.drop_constant_groups)
  batch       <- the padded next-token batch (`seal_jax.trajectories`), prompts shared per group
  old / ref   <- log-probs of the rollout policy (the engine's, or a recompute) and of the
                 frozen reference (when rl.kl_coef > 0), one mini-batch at a time
  update      <- train.ppo_epochs over mini-batches (one optimizer step each) of
                 optim.grad_accum micro-batches (`seal_jax.train_step`)
Mini-batches take rows longest first, so each is padded only to its own longest row.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging

from seal_jax import config as config_lib
from seal_jax import distributed, optim, preemption, rl, sharding, train_step, trajectories
from seal_jax.models import LoadedModel, token_logprobs
from seal_jax.rollout import TokenSequence


@dataclasses.dataclass(frozen=True)
class Updater:
    """The compiled update programs of a run and the settings that shape its batches.

    Attributes:
      config: the run's config.
      mesh: the training mesh.
      step_fn: `(params, opt_state, batch) -> (params, opt_state, metrics)`, one micro-batch.
      logprob_fn: `(params, batch) -> log p(targets) [B, T]`, jitted.
      share_prompt: update batches hold each group's prompt once (train.share_prompt).
      optimizer: the optax optimizer (`seal_jax.optim.make_optimizer`).
      init_opt_state: `params -> optimizer state`, sharded like the parameters.
    """

    config: Any
    mesh: Any
    step_fn: train_step.TrainStep
    logprob_fn: Any
    share_prompt: bool
    optimizer: Any
    init_opt_state: Any


def build_updater(config: Any, model: LoadedModel) -> Updater:
    """The update programs for `model` under `config`.

    Raises:
      ConfigError: a micro-batch does not split over the mesh's batch shards.
    """
    shards = model.mesh.shape["data"] * model.mesh.shape["fsdp"]
    rows = micro_batch_rows(config)
    if rows % shards:
        raise config_lib.ConfigError(
            f"a micro-batch of {rows} rollouts does not split over the {shards} batch shards "
            "(mesh.data x mesh.fsdp): change train.mini_batch_tasks or optim.grad_accum"
        )
    logprobs = functools.partial(
        token_logprobs,
        cfg=model.config,
        dtype=model.compute_dtype,
        chunk=config.model.logprob_chunk,
        remat=config.model.remat,
        with_entropy=config.rl.entropy_coef > 0,
        attn_chunk=config.model.attn_chunk,
        mlp_chunk=config.model.mlp_chunk,
        attention=attention_kernel(config.model.attention, model.mesh),
        scan_unroll=config.model.scan_unroll,
    )

    def policy_logprobs(
        params: Any, input_ids: Any, positions: Any, mask: Any, targets: Any, prompt: Any = None
    ) -> Any:
        """log p(targets) [B, T], and the per-token entropy when the loss needs it."""
        out, entropy = logprobs(
            params,
            input_ids=input_ids,
            positions=positions,
            mask=mask,
            targets=targets,
            prompt=prompt,
        )
        return out if entropy is None else (out, entropy)

    optimizer = optim.make_optimizer(config.optim)
    step_fn, init_opt_state = train_step.make_update_step(
        rl.make_loss_fn(policy_logprobs, config.rl), optimizer, model.params, model.mesh
    )
    forward = jax.jit(
        lambda params, b: logprobs(
            params,
            input_ids=b["input_ids"],
            positions=b["positions"],
            mask=b["mask"],
            targets=b["targets"],
            prompt=rl.shared_prompt(b),
        )[0],
        out_shardings=sharding.batch_sharding(model.mesh, ndim=1),
    )
    share_prompt = can_share_prompt(config, shards)
    return Updater(config, model.mesh, step_fn, forward, share_prompt, optimizer, init_opt_state)


def attention_kernel(setting: str, mesh: Any) -> str:
    """The kernel (`seal_jax.models.layers.ATTENTION_KERNELS`) of `model.attention` on the mesh's
    devices: "auto" is the Pallas splash kernel on TPU and XLA's attention elsewhere; "splash"
    off TPU runs the kernel in Pallas' interpreter (slow: for tests)."""
    tpu = mesh.devices.flat[0].platform == "tpu"
    if setting == "auto":
        return "splash" if tpu else "xla"
    return "splash_interpret" if setting == "splash" and not tpu else setting


def micro_batch_rows(config: Any) -> int:
    """Rows of one update micro-step: train.mini_batch_tasks x rl.group_size / optim.grad_accum."""
    return config.train.mini_batch_tasks * config.rl.group_size // config.optim.grad_accum


def frozen_reference(params: Any, compute_dtype: Any, on_host: bool = False) -> Any:
    """A copy of params in the compute dtype, for the KL reference: every forward pass casts the
    weights to the compute dtype first, so its log-probs are those of the fp32 weights, at half
    the memory under bfloat16 compute. (A copy either way: the update donates its params.)
    on_host: keep it in host memory (`rl.reference_on_host`); the reference pass brings it to
    the chips for the pass alone."""

    def copy(x: jax.Array) -> jax.Array:
        y = jnp.copy(x) if x.dtype == compute_dtype else x.astype(compute_dtype)
        return jax.device_put(y, y.sharding.with_memory_kind(optim.HOST)) if on_host else y

    return jax.tree.map(copy, params)


def _on_chips(params: Any) -> Any:
    """params in device memory (a host-resident reference is copied in for one pass)."""
    return jax.tree.map(lambda x: jax.device_put(x, x.sharding.with_memory_kind("device")), params)


def can_share_prompt(config: Any, shards: int) -> bool:
    """train.share_prompt, unless a micro-batch's groups cannot be split over the batch shards
    (then each row carries its own prompt, with a warning: slower, same result)."""
    groups, accum = config.train.mini_batch_tasks, config.optim.grad_accum
    if not config.train.share_prompt:
        return False
    if groups % accum or (groups // accum) % shards:
        logging.warning(
            "train.share_prompt is off for this run: train.mini_batch_tasks=%d tasks over "
            "optim.grad_accum=%d micro-batches do not give each of the %d batch shards whole "
            "tasks; make train.mini_batch_tasks a multiple of %d to share prompts",
            groups,
            accum,
            shards,
            accum * shards,
        )
        return False
    return True


def update_policy(
    updater: Updater,
    params: Any,
    opt_state: Any,
    sequences: Sequence[TokenSequence],
    advantages: np.ndarray,
    ref_params: Any = None,
) -> tuple[Any, Any, dict]:
    """Trains the policy on one step's rollouts; see the module docstring.

    Args:
      updater: from `build_updater`.
      params, opt_state: the current policy and optimizer state (donated).
      sequences: the step's rollout sequences, groups of rl.group_size consecutive rows.
      advantages: float32 [len(sequences)], already weighted.
      ref_params: the frozen reference policy (needed when rl.kl_coef > 0).
    Returns:
      (params, opt_state, metrics): metrics hold `loss` (the loss metrics averaged over
      micro-steps; {} when no group had a learning signal), `batch_tokens`, `update_groups` and,
      with recomputed old log-probs, `logprob_gap_sampler_vs_recomputed`.
    """
    cfg = updater.config
    rows, trained = _update_rows(cfg, advantages)
    recompute = cfg.rl.old_logprobs == "recompute"
    metrics = {"batch_tokens": 0, "update_groups": len(rows) // cfg.rl.group_size, "loss": {}}
    if recompute:
        metrics["logprob_gap_sampler_vs_recomputed"] = 0.0
    if not rows.size:
        return params, opt_state, metrics
    batch = trajectories.training_batch(
        [sequences[i] for i in rows],
        advantages[rows],
        cfg.train.length_bucket,
        group_size=cfg.rl.group_size if updater.share_prompt else 0,
    )
    batch["loss_mask"][~trained] = False
    if recompute:
        batch["old_logprobs"] = _forward_logprobs(updater, params, batch)
        gap = np.abs(batch["old_logprobs"] - batch["rollout_logprobs"])[batch["loss_mask"]]
        metrics["logprob_gap_sampler_vs_recomputed"] = float(gap.mean()) if gap.size else 0.0
    else:
        batch["old_logprobs"] = batch["rollout_logprobs"]
    if cfg.rl.kl_coef > 0:
        batch["ref_logprobs"] = _forward_logprobs(updater, _on_chips(ref_params), batch)
    metrics["batch_tokens"] = int(batch["mask"].sum() + batch.get("prompt_mask", np.zeros(0)).sum())
    del batch["rollout_logprobs"]
    params, opt_state, metrics["loss"] = _ppo_epochs(updater, params, opt_state, batch)
    return params, opt_state, metrics


def _update_rows(cfg: Any, advantages: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Rows of the step batch the update trains on, and which of them carry loss (see
    `trajectories.update_rows`): all of them unless rl.drop_constant_groups."""
    if cfg.rl.drop_constant_groups:
        return trajectories.update_rows(advantages, cfg.rl.group_size, cfg.train.mini_batch_tasks)
    return np.arange(len(advantages)), np.ones(len(advantages), bool)


def _ppo_epochs(updater: Updater, params: Any, opt_state: Any, batch: dict) -> tuple:
    """PPO epochs over mini-batches (optimizer steps) of micro-batches (accumulated); returns
    the new params and optimizer state and the loss metrics averaged over micro-steps."""
    cfg = updater.config
    micro = []
    for _ in range(cfg.train.ppo_epochs):
        for _, mini in mini_batches(updater, batch, list(batch)):
            for part in train_step.split_micro_batches(mini, cfg.optim.grad_accum, cfg.rl.loss_agg):
                preemption.check()  # a stop signal abandons the update here (one host)
                with jax.set_mesh(updater.mesh):
                    params, opt_state, m = updater.step_fn(params, opt_state, _put(updater, part))
                micro.append({k: distributed.to_host(v) for k, v in m.items()})
    return params, opt_state, {k: float(np.mean([m[k] for m in micro])) for k in micro[0]}


def _forward_logprobs(updater: Updater, params: Any, batch: dict[str, np.ndarray]) -> np.ndarray:
    """log p(targets) [B, T] under params for the whole batch, a micro-batch of rows at a time
    (the rows an update micro-step holds, so the pass needs no more memory than the update)."""
    keys = ("input_ids", "positions", "mask", "targets")
    out = np.zeros(batch["targets"].shape, np.float32)
    for idx, part in mini_batches(updater, batch, keys, parts=updater.config.optim.grad_accum):
        preemption.check()
        with jax.set_mesh(updater.mesh):
            logprobs = distributed.to_host(updater.logprob_fn(params, _put(updater, part)))
        out[idx, : logprobs.shape[1]] = logprobs
    return out


def mini_batches(
    updater: Updater, batch: dict[str, np.ndarray], keys: Any, parts: int = 1
) -> list[tuple[np.ndarray, dict[str, np.ndarray]]]:
    """(row indices, sub-batch of those keys and any shared prompt) of each mini-batch, or of
    each of its `parts` equal parts.

    Rows are taken longest first (with shared prompts, whole groups, by their longest row), so
    each mini-batch is padded only to its own longest row and prompt (advantages are per row, so
    any grouping of rows into mini-batches is valid).
    """
    cfg = updater.config
    lengths = batch["mask"].sum(axis=1)
    bucket = cfg.train.length_bucket
    shared = rl.PROMPT_KEYS[0] in batch
    g = cfg.rl.group_size if shared else 1  # rows taken together
    per_mini_batch = cfg.train.mini_batch_tasks * cfg.rl.group_size // g // parts
    order = np.argsort(-lengths.reshape(-1, g).max(axis=1), kind="stable")
    row_keys = [k for k in keys if k not in rl.PROMPT_KEYS]
    out = []
    for units in (order[s : s + per_mini_batch] for s in range(0, len(order), per_mini_batch)):
        idx = (units[:, None] * g + np.arange(g)).reshape(-1)
        part = _rows(batch, row_keys, idx, trajectories.padded_length(lengths[idx], bucket))
        if shared:
            width = trajectories.padded_length(batch["prompt_mask"][units].sum(axis=1), bucket)
            part.update({k: batch[k][units, :width] for k in rl.PROMPT_KEYS})
        out.append((idx, part))
    return out


def _rows(batch: dict[str, np.ndarray], keys: Any, idx: np.ndarray, length: int) -> dict:
    """The given rows of batch, [B, T] arrays cut to the first `length` positions."""
    return {k: batch[k][idx, :length] if batch[k].ndim == 2 else batch[k][idx] for k in keys}


def _put(updater: Updater, batch: dict[str, np.ndarray]) -> dict[str, jax.Array]:
    """Global arrays (rows over the batch axes) from host arrays every process holds in full."""
    place = sharding.batch_sharding(updater.mesh, ndim=1)
    return {k: distributed.put_global(np.asarray(v), place) for k, v in batch.items()}
