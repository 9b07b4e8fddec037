"""Supervised warm start on oracle transcripts, and a from-scratch tiny policy for the suite.

Transcripts are built token-in / token-out exactly as the rollout engine builds an episode (see
`seal_jax.chat`): the oracle is replayed through a real training-mode `Episode`, the prompt and
every environment observation are tokenized once with `ChatFormat`, and each oracle message
contributes `chat.encode(text) + [end_of_turn_id]`, the ids a policy would have to sample. The loss
mask is True on those assistant ids only, so the warm start imitates the oracle's replies and
never the environment's text.

`warm_start` minimises the token-mean cross-entropy of the masked ids with AdamW (cosine decay),
through the project's sharded train step. Batches are drawn by a seeded permutation and padded to
length buckets, so a run is deterministic and compiles once per bucket.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging
from jax.sharding import Mesh

from environments.episode import Episode, EpisodeConfig
from environments.policies import oracle_turns
from environments.rendering import Renderer
from environments.task import ToolTask
from seal_jax import optim, train_step
from seal_jax.chat import ChatFormat
from seal_jax.models import QwenConfig, init_params, save_hf_checkpoint, token_logprobs
from seal_jax.models.checkpoint import hf_config_dict
from seal_jax.trajectories import next_token_batch

Transcript = tuple[np.ndarray, np.ndarray]  # (int32 ids [N], bool loss mask [N])
LOG_SECONDS = 60.0  # the warm start logs at least this often


def oracle_transcript(
    task: ToolTask, chat: ChatFormat, renderer: Renderer | None = None
) -> Transcript:
    """The token ids and loss mask of the oracle's training-mode episode on one task.

    Args:
      task: the task.
      chat: the policy's chat format.
      renderer: the interface shown to the agent (default: the plain one; pass the training
        interface's renderer to warm-start on what RL rollouts will show).

    Raises:
      ValueError: the oracle's replay does not finish the episode with success.
    """
    renderer = dataclasses.replace(renderer or Renderer(), tool_format=chat.tool_format)
    episode = Episode(task, EpisodeConfig(mode="training"), renderer)
    ids = chat.prompt_ids(episode.reset())
    mask = [False] * len(ids)
    done = False
    for text in (message for turn in oracle_turns(task, chat.tool_format) for message in turn):
        reply = chat.encode(text) + [chat.end_of_turn_id]
        ids += reply
        mask += [True] * len(reply)
        observation, done = episode.step(text)
        if done:
            break
        env = chat.env_ids(observation, turn_closed=True)
        ids += env
        mask += [False] * len(env)
    result = episode.result()
    if not (done and result.success):
        raise ValueError(
            f"task {task.task_id}: the oracle's replay does not solve it in training mode "
            f"(failure {result.failure_reason!r}, tags {result.turn_tags})"
        )
    return np.asarray(ids, np.int32), np.asarray(mask, bool)


def oracle_transcripts(
    tasks: Sequence[ToolTask], chat: ChatFormat, renderer: Renderer | None = None
) -> list[Transcript]:
    """`oracle_transcript` of every task, in order."""
    return [oracle_transcript(task, chat, renderer) for task in tasks]


def sft_batch(
    transcripts: Sequence[Transcript], length_bucket: int, all_tokens: bool = False
) -> dict[str, np.ndarray]:
    """Right-padded next-token batch (`seal_jax.trajectories.next_token_batch`) of whole
    transcripts: input_ids, positions, mask, targets and loss_mask [B, T], the loss on the
    assistant ids (on every transcript id when `all_tokens`)."""
    ids = [ids for ids, _ in transcripts]
    masks = [np.ones(len(i), bool) if all_tokens else mask for i, mask in transcripts]
    return next_token_batch(ids, masks, length_bucket)


def _cross_entropy(
    params: Any,
    batch: Mapping[str, jax.Array],
    *,
    cfg: QwenConfig,
    dtype: Any,
    chunk: int,
    scan_unroll: int,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Token-mean negative log-likelihood of the masked targets."""
    logprobs, _ = token_logprobs(
        params,
        cfg,
        batch["input_ids"],
        batch["positions"],
        batch["mask"],
        batch["targets"],
        dtype=dtype,
        chunk=chunk,
        scan_unroll=scan_unroll,
    )
    weights = batch["loss_mask"].astype(jnp.float32)
    tokens = jnp.sum(weights)
    nll = -jnp.sum(logprobs * weights) / jnp.maximum(tokens, 1.0)
    return nll, {"tokens": tokens}


def warm_start(
    params: Any,
    model_config: QwenConfig,
    mesh: Mesh,
    transcripts: Sequence[Transcript],
    *,
    steps: int,
    batch_size: int,
    lr: float,
    seed: int,
    warmup_steps: int = 0,
    weight_decay: float = 0.0,
    grad_clip: float = 1.0,
    length_bucket: int = 128,
    all_token_steps: int = 0,
    dtype: Any = jnp.float32,
    chunk: int = 512,
    scan_unroll: int = 1,
    log_every: int = 50,
) -> Any:
    """Fine-tunes params on the transcripts' assistant ids; returns the new params.

    Args:
      params: the policy's parameters, sharded on `mesh` (donated: do not use them afterwards).
      model_config: the architecture.
      mesh: the device mesh; `batch_size` must be a multiple of its data x fsdp size.
      transcripts: (ids, loss_mask) pairs, e.g. from `oracle_transcripts`.
      steps: optimizer steps; each takes `batch_size` transcripts from a seeded permutation
        (a new permutation per pass over the transcripts).
      lr: peak learning rate of AdamW, reached after `warmup_steps`, then cosine decay to 0.
      seed: fixes the batch order (the only randomness).
      weight_decay, grad_clip: AdamW's decoupled weight decay, global-norm clipping (0: off).
      length_bucket: batch lengths are padded to a multiple of this (one compile per bucket).
      all_token_steps: the first this many steps fit every transcript id (prompts, user and tool
        messages too), the remaining ones only the assistant replies.
      dtype: compute dtype; chunk: sequence chunk of the vocabulary projection.
      scan_unroll: layers per iteration of the layer scan (`Qwen.scan_unroll`).
      log_every: log loss and rates every this many steps, at the last step, and after any
        step that ends LOG_SECONDS after the previous line (a real model's slow steps).
    """
    batch_devices = mesh.shape["data"] * mesh.shape["fsdp"]
    if not transcripts or steps < 1 or batch_size < 1 or batch_size % batch_devices:
        raise ValueError(
            f"warm_start needs transcripts, steps >= 1 and a batch size that is a positive "
            f"multiple of the {batch_devices} batch devices; got {len(transcripts)} transcripts, "
            f"steps={steps}, batch_size={batch_size}"
        )
    optimizer = optim.make_optimizer(
        SimpleNamespace(
            lr=lr,
            schedule="cosine",
            warmup_steps=warmup_steps,
            total_steps=steps,
            weight_decay=weight_decay,
            b1=0.9,
            b2=0.999,
            eps=1e-8,
            mu_dtype="float32",
            grad_clip=grad_clip,
            grad_accum=1,
            moments_on_host=False,
        )
    )
    step_fn, init_opt_state = train_step.make_update_step(
        functools.partial(
            _cross_entropy, cfg=model_config, dtype=dtype, chunk=chunk, scan_unroll=scan_unroll
        ),
        optimizer,
        params,
        mesh,
    )
    opt_state = init_opt_state(params)
    order = _batch_order(len(transcripts), steps * batch_size, seed)
    start, tokens = time.perf_counter(), 0
    logged = start
    for step in range(steps):
        rows = order[step * batch_size : (step + 1) * batch_size]
        batch = sft_batch([transcripts[i] for i in rows], length_bucket, step < all_token_steps)
        tokens += int(batch["loss_mask"].sum())
        with jax.set_mesh(mesh):
            params, opt_state, metrics = step_fn(params, opt_state, batch)
        late = time.perf_counter() - logged > LOG_SECONDS
        if (step + 1) % log_every == 0 or step + 1 == steps or late:
            loss = float(metrics["loss"])  # waits for the step: the rates below are real
            logged = time.perf_counter()
            elapsed = logged - start
            logging.info(
                "warm start step %d/%d: loss %.4f, %.2f steps/s, %.0f target tokens/s",
                step + 1,
                steps,
                loss,
                (step + 1) / elapsed,
                tokens / elapsed,
            )
    return params


def _batch_order(num_transcripts: int, count: int, seed: int) -> np.ndarray:
    """`count` transcript indices: seeded permutations of all transcripts, one after another."""
    rng = np.random.default_rng(seed)
    passes = -(-count // num_transcripts)
    return np.concatenate([rng.permutation(num_transcripts) for _ in range(passes)])[:count]


def make_tiny_policy(
    out_dir: str | Path,
    *,
    hidden: int = 128,
    layers: int = 2,
    heads: int = 4,
    kv_heads: int = 2,
    intermediate: int = 384,
    seed: int = 0,
    tokenizer_dir: str | Path | None = None,
) -> QwenConfig:
    """Writes a randomly initialised Qwen2 checkpoint (float32, tied embeddings) for the suite.

    The vocabulary is the tokenizer's (default: the suite's tiny tokenizer, whose files are
    copied next to the weights), so the directory loads with `load_hf_checkpoint` like any Qwen
    checkpoint. Returns the architecture.
    """
    from transformers import AutoTokenizer

    if tokenizer_dir is None:
        from environments.suite.tokenizer import TOKENIZER_DIR

        tokenizer_dir = TOKENIZER_DIR
    if hidden % heads or heads % kv_heads:
        raise ValueError(
            f"need hidden % heads == 0 and heads % kv_heads == 0; got hidden={hidden}, "
            f"heads={heads}, kv_heads={kv_heads}"
        )
    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir), local_files_only=True)
    cfg = QwenConfig(
        model_type="qwen2",
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=hidden // heads,
        rope_theta=10000.0,
        rms_norm_eps=1e-6,
        qkv_bias=True,
        qk_norm=False,
        tie_word_embeddings=True,
        max_position_embeddings=4096,
    )
    special = {
        "eos_token_id": tokenizer.convert_tokens_to_ids("<|im_end|>"),
        "pad_token_id": tokenizer.pad_token_id,
        "bos_token_id": None,
    }
    cfg = dataclasses.replace(cfg, hf_config={**hf_config_dict(cfg, "float32"), **special})
    params = init_params(cfg, jax.random.key(seed))
    save_hf_checkpoint(str(out_dir), params, cfg, dtype="float32", tokenizer_dir=str(tokenizer_dir))
    return cfg
