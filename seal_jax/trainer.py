"""The SEAL co-evolution loop (SEAL_METHOD.md section 1), driven by `run.py --mode=train`.

One step:
  tasks      <- B training tasks (a seeded permutation per epoch; the position follows the step)
  episodes   <- G rollouts per task through the CURRENT interface (seal_jax.episodes)
  verdicts   <- rewards, per-turn tags and causes from the environment pool
  host state <- tag statistics, utilities rho, interface Omega (once per step)
  advantages <- GRPO per group, times the trajectory weights w(tags)
  update     <- PPO-clip + KL on the model's tokens: mini-batches x micro-batches, ppo_epochs;
                each task's prompt is run once for its G rows (train.share_prompt)
Evaluation (greedy, plain interface, official semantics) runs before training, every
`train.eval_every` steps and at the end. Checkpoints carry everything needed to continue
bit-for-bit; restarting the same command on the same work directory resumes.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging

from environments.episode import EpisodeConfig, strict_success
from environments.interface import LearningInterface
from environments.pool import EnvPool, PoolConfig
from environments.sources import TaskSource, get_source
from environments.weighting import DiagnosisWeighting, weight_metrics
from seal_jax import config as config_lib
from seal_jax import (
    distributed,
    episodes,
    optim,
    report,
    rl,
    rollout,
    sharding,
    train_step,
    trajectories,
)
from seal_jax.chat import ChatFormat
from seal_jax.checkpointing import Checkpointer
from seal_jax.metrics import MetricsWriter
from seal_jax.models import LoadedModel, token_logprobs
from seal_jax.sampler import SamplingParams


@dataclasses.dataclass
class Run:
    """Everything built once per run (see `build`)."""

    config: Any
    workdir: str
    model: LoadedModel
    chat: ChatFormat
    source: TaskSource
    train_engine: rollout.RolloutEngine
    eval_engine: rollout.RolloutEngine
    rollout_mesh: Any
    optimizer: Any
    step_fn: Any
    logprob_fn: Any
    opt_state_shardings: Any
    share_prompt: bool  # update batches hold each group's prompt once (train.share_prompt)


@dataclasses.dataclass
class State:
    """What a checkpoint restores: device arrays plus plain host data."""

    step: int
    params: Any
    opt_state: Any
    weighting: DiagnosisWeighting
    interface: LearningInterface
    best_metric: float = float("-inf")
    last_eval: dict = dataclasses.field(default_factory=dict)

    def host_dict(self) -> dict:
        """The JSON part of a checkpoint."""
        return {
            "step": self.step,
            "weighting": self.weighting.to_dict(),
            "interface": self.interface.to_dict(),
            "best_metric": self.best_metric,
            "last_eval": self.last_eval,
        }


def steps_per_epoch(config: Any, source: TaskSource) -> int:
    """Training steps in one pass over the training split (the remainder is dropped)."""
    n = len(source.split_ids("train")) // config.train.batch_tasks
    if n < 1:
        raise config_lib.ConfigError(
            f"--config.train.batch_tasks={config.train.batch_tasks} exceeds the "
            f"{len(source.split_ids('train'))} training tasks"
        )
    return n


def total_steps(config: Any, source: TaskSource) -> int:
    """train.max_steps, or epochs x steps per epoch."""
    return config.train.max_steps or config.train.epochs * steps_per_epoch(config, source)


def step_tasks(config: Any, source: TaskSource, step: int) -> list[str]:
    """The B tasks of `step`: slice `step % E` of epoch `step // E`'s seeded permutation."""
    ids = source.split_ids("train")
    per_epoch = steps_per_epoch(config, source)
    epoch, index = divmod(step, per_epoch)
    order = np.random.default_rng([config.seed, epoch]).permutation(len(ids))
    b = config.train.batch_tasks
    return [ids[i] for i in order[index * b : (index + 1) * b]]


def _engine(
    model: LoadedModel,
    mesh: Any,
    config: Any,
    chat: ChatFormat,
    sampling: SamplingParams,
    max_new_tokens: int,
) -> rollout.RolloutEngine:
    """An engine on `mesh`; its params are set before each use (`_set_engine_params`)."""
    engine_config = rollout.EngineConfig(
        context_limit=config.rollout.context_limit,
        max_new_tokens=max_new_tokens,
        stop_ids=chat.stop_ids,
        sampling=sampling,
        prefill_chunk=config.rollout.prefill_chunk,
        min_batch=config.rollout.min_batch,
        min_prefill_width=config.rollout.min_prefill_width,
    )
    return rollout.RolloutEngine(None, model.config, mesh, engine_config, model.compute_dtype)


def build(config: Any, model: LoadedModel, workdir: str) -> Run:
    """Tokenizer, task source, rollout engines, optimizer and the compiled update."""
    chat = ChatFormat(model.tokenizer(), enable_thinking=config.rollout.enable_thinking)
    source = get_source(config.env.name)
    r = config.rollout
    sampling = SamplingParams("sample", r.temperature, r.top_k, r.top_p)
    # Rollouts are host-local: on one process the global mesh, else this process's devices.
    mesh = distributed.local_mesh() if distributed.multi_process() else model.mesh
    train_engine = _engine(model, mesh, config, chat, sampling, r.max_new_tokens)
    eval_engine = _engine(
        model, mesh, config, chat, SamplingParams("greedy"), config.train.eval_max_new_tokens
    )
    logprobs = functools.partial(
        token_logprobs,
        cfg=model.config,
        dtype=model.compute_dtype,
        chunk=config.model.logprob_chunk,
        remat=config.model.remat,
        with_entropy=config.rl.entropy_coef > 0,
        attn_chunk=config.model.attn_chunk,
        scan_unroll=config.model.scan_unroll,
    )

    def logprob_fn(
        params: Any, input_ids: Any, positions: Any, mask: Any, targets: Any, prompt: Any = None
    ) -> Any:
        out, entropy = logprobs(
            params,
            input_ids=input_ids,
            positions=positions,
            mask=mask,
            targets=targets,
            prompt=prompt,
        )
        return out if entropy is None else (out, entropy)

    shards = model.mesh.shape["data"] * model.mesh.shape["fsdp"]
    rows = config.train.mini_batch_tasks * config.rl.group_size // config.optim.grad_accum
    if rows % shards:
        raise config_lib.ConfigError(
            f"a micro-batch of {rows} rollouts does not split over the {shards} batch shards "
            "(mesh.data x mesh.fsdp): change train.mini_batch_tasks or optim.grad_accum"
        )
    share_prompt = _can_share_prompt(config, shards)
    optimizer = optim.make_optimizer(config.optim)
    param_shardings = jax.tree.map(lambda x: x.sharding, model.params)
    opt_shardings = optim.opt_state_shardings(optimizer, model.params, param_shardings)
    step_fn = train_step.make_train_step(
        rl.make_loss_fn(logprob_fn, config.rl),
        optimizer,
        param_shardings,
        sharding.batch_sharding(model.mesh, ndim=1),
        opt_shardings,
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
    return Run(
        config,
        workdir,
        model,
        chat,
        source,
        train_engine,
        eval_engine,
        mesh,
        optimizer,
        step_fn,
        forward,
        opt_shardings,
        share_prompt,
    )


def _can_share_prompt(config: Any, shards: int) -> bool:
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


def _pool(run: Run, mode: str) -> EnvPool:
    env = run.config.env
    episode = EpisodeConfig(
        mode=mode, max_model_calls=env.max_model_calls, call_time_limit_s=env.call_time_limit_s
    )
    return EnvPool(run.source.load_task, PoolConfig(num_workers=env.num_workers, episode=episode))


def _put(run: Run, batch: dict[str, np.ndarray]) -> dict[str, jax.Array]:
    """Global arrays (rows over the batch axes) from host arrays every process holds in full."""
    place = sharding.batch_sharding(run.model.mesh, ndim=1)
    return {k: distributed.put_global(np.asarray(v), place) for k, v in batch.items()}


def _mini_batches(
    run: Run, batch: dict[str, np.ndarray], keys: Any
) -> list[tuple[np.ndarray, dict[str, np.ndarray]]]:
    """(row indices, sub-batch of those keys and any shared prompt) of each mini-batch.

    Rows are taken longest first (with shared prompts, whole groups, by their longest row), so
    each mini-batch is padded only to its own longest row and prompt (advantages are per row, so
    any grouping of rows into mini-batches is valid).
    """
    cfg = run.config
    lengths = batch["mask"].sum(axis=1)
    bucket = cfg.train.length_bucket
    shared = rl.PROMPT_KEYS[0] in batch
    g = cfg.rl.group_size if shared else 1  # rows taken together
    per_mini_batch = cfg.train.mini_batch_tasks * cfg.rl.group_size // g
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


def _forward_logprobs(run: Run, params: Any, batch: dict[str, np.ndarray]) -> np.ndarray:
    """log p(targets) [B, T] under params for the whole batch, one mini-batch at a time."""
    keys = ("input_ids", "positions", "mask", "targets")
    out = np.zeros(batch["targets"].shape, np.float32)
    for idx, part in _mini_batches(run, batch, keys):
        with jax.set_mesh(run.model.mesh):
            logprobs = distributed.to_host(run.logprob_fn(params, _put(run, part)))
        out[idx, : logprobs.shape[1]] = logprobs
    return out


def _set_engine_params(engine: rollout.RolloutEngine, params: Any, run: Run) -> None:
    """Gives the engine the current policy (a host-local copy when there are several hosts)."""
    multi = distributed.multi_process()
    engine.params = distributed.local_copy(params, run.rollout_mesh) if multi else params


def _host_share(items: list[str]) -> list[str]:
    """This process's contiguous share of a list that divides evenly over processes."""
    n, p = jax.process_count(), jax.process_index()
    if len(items) % n:
        raise config_lib.ConfigError(f"{len(items)} tasks do not split over {n} processes")
    size = len(items) // n
    return items[p * size : (p + 1) * size]


def eval_task_ids(source: TaskSource, limit: int) -> list[str]:
    """The evaluation split, or its first limit tasks taken round-robin over categories."""
    ids = source.split_ids("eval")
    if not limit:
        return ids
    by_category = [[i for i in ids if source.category_of(i) == c] for c in source.categories]
    mixed = [i for group in zip(*by_category) for i in group]
    return mixed[:limit]


def evaluate(run: Run, params: Any, step: int) -> dict:
    """Greedy episodes on the evaluation split with the plain interface.

    Returns per-category official accuracy and its mean, the same with BFCL's irrelevance check
    (`strict_accuracy`, `strict_mean`; see EpisodeResult.strict_success), turn tag counts,
    the number of tasks and the seconds taken."""
    ids = eval_task_ids(run.source, run.config.train.eval_limit)
    _set_engine_params(run.eval_engine, params, run)
    t0 = time.perf_counter()
    local = []
    with _pool(run, "official") as pool:
        size = run.config.train.eval_batch_tasks
        mine = ids[jax.process_index() :: jax.process_count()]
        for start in range(0, len(mine), size):
            chunk = mine[start : start + size]
            out = episodes.run_episodes(run.eval_engine, run.chat, pool, chunk, 1, seed=step)
            local += [
                (t, bool(r.success), r.strict_success, r.turn_tags)
                for t, r in zip(chunk, out.results.episodes)
            ]
    results = [x for part in distributed.allgather_objects(local) for x in part]
    by_category: dict[str, list[tuple[bool, bool]]] = {}
    tags: dict[str, int] = {}
    for task_id, success, passes_strict, turn_tags in results:
        by_category.setdefault(run.source.category_of(task_id), []).append((success, passes_strict))
        for tag in turn_tags:
            tags[tag] = tags.get(tag, 0) + 1
    means = {c: np.mean(by_category[c], axis=0) for c in run.source.categories if c in by_category}
    accuracy = {c: float(m[0]) for c, m in means.items()}
    strict = {c: float(m[1]) for c, m in means.items()}
    metrics = {
        "accuracy": accuracy,
        "mean": float(np.mean(list(accuracy.values()))),
        "strict_accuracy": strict,
        "strict_mean": float(np.mean(list(strict.values()))),
        "tags": tags,
        "num_tasks": len(results),
        "seconds": time.perf_counter() - t0,
    }
    logging.info(
        "eval at step %d: mean %.4f %s (strict mean %.4f)",
        step,
        metrics["mean"],
        accuracy,
        metrics["strict_mean"],
    )
    return metrics


# Tags of turns whose ground truth makes no call (the right move is to answer in plain text).
NO_CALL_TAGS = ("correct_abstention", "spurious_tool_call")


def episode_rewards(results: Any, kind: str) -> np.ndarray:
    """Rewards [B]: "binary" (1.0 on success, the paper's), "strict" (1.0 on success without a
    call on any turn whose ground truth makes none: `environments.episode.strict_success`) or
    "progress" (passed turns / turns with a ground-truth call, SEAL_METHOD.md section 5; binary
    for episodes without such turns).
    """
    if kind == "binary":
        return np.asarray(results.rewards, np.float32)
    if kind == "strict":
        pairs = zip(results.rewards, results.turn_tags)
        return np.asarray([strict_success(r, tags) for r, tags in pairs], np.float32)
    if kind != "progress":
        raise config_lib.ConfigError(f"--config.rl.reward={kind!r}: use binary, strict or progress")
    out = []
    for success, tags in zip(results.rewards, results.turn_tags):
        graded = [t for t in tags if t not in NO_CALL_TAGS]
        out.append(sum(t == "pass" for t in graded) / len(graded) if graded else float(success))
    return np.asarray(out, np.float32)


def _rollout_metrics(batch: episodes.EpisodeBatch, source: TaskSource) -> dict:
    """Rewards, success per category, tag fractions, format-error and empty-reply rates."""
    res = batch.results
    per_cat: dict[str, list[float]] = {}
    for task_id, reward in zip(batch.task_ids, res.rewards):
        per_cat.setdefault(source.category_of(task_id), []).append(float(reward))
    all_tags = [t for tags in res.turn_tags for t in tags]
    kinds = [k for ep in res.episodes for turn in ep.turn_error_kinds for k in turn]
    replies = [m for ep in res.episodes for m in ep.transcript if m["role"] == "assistant"]
    tokens = sum(int(s.loss_mask.sum()) for s in batch.sequences)
    return {
        "reward_mean": float(np.mean(res.rewards)),
        "success": {c: float(np.mean(v)) for c, v in per_cat.items()},
        "tag_fraction": {t: all_tags.count(t) / max(len(all_tags), 1) for t in set(all_tags)},
        "format_error_rate": kinds.count("unparseable") / max(len(replies), 1),
        "empty_reply_rate": sum(not m["content"].strip() for m in replies) / max(len(replies), 1),
        "calls_per_episode": float(np.mean(batch.num_calls)),
        "context_limit_fraction": batch.stop_reasons.count(rollout.CONTEXT_LIMIT)
        / len(batch.stop_reasons),
        "tokens_generated": tokens,
    }


def _update(run: Run, state: State, batch: dict[str, np.ndarray]) -> dict:
    """PPO epochs over mini-batches (optimizer steps) of micro-batches (accumulated)."""
    cfg = run.config
    micro = []
    keys = [k for k in batch if k != "sampler_logprobs"]
    for _ in range(cfg.train.ppo_epochs):
        for _, mini in _mini_batches(run, batch, keys):
            for part in train_step.split_micro_batches(mini, cfg.optim.grad_accum, cfg.rl.loss_agg):
                with jax.set_mesh(run.model.mesh):
                    state.params, state.opt_state, m = run.step_fn(
                        state.params, state.opt_state, _put(run, part)
                    )
                micro.append({k: distributed.to_host(v) for k, v in m.items()})
    return {k: float(np.mean([m[k] for m in micro])) for k in micro[0]}


def _update_rows(cfg: Any, advantages: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Rows of the step batch the update trains on, and which of them carry loss (see
    `trajectories.update_rows`): all of them unless rl.drop_constant_groups."""
    if cfg.rl.drop_constant_groups:
        return trajectories.update_rows(advantages, cfg.rl.group_size, cfg.train.mini_batch_tasks)
    return np.arange(len(advantages)), np.ones(len(advantages), bool)


def train_one_step(run: Run, state: State, pool: EnvPool, ref_params: Any) -> dict:
    """Runs step `state.step` of SEAL and advances the state; returns the step's metrics."""
    cfg, t_start = run.config, time.perf_counter()
    if state.step and state.step % steps_per_epoch(cfg, run.source) == 0:
        state.weighting.end_epoch()
    task_ids = step_tasks(cfg, run.source, state.step)
    _set_engine_params(run.train_engine, state.params, run)
    mine = _host_share(task_ids)
    chunk = cfg.rollout.micro_batch_tasks or len(mine)  # bounds the KV cache of one rollout
    local = [
        episodes.run_episodes(
            run.train_engine,
            run.chat,
            pool,
            mine[start : start + chunk],
            cfg.rl.group_size,
            seed=((cfg.seed * 1_000_003 + state.step) * 1024 + jax.process_index()) * 1024 + start,
            renderer=state.interface.renderer(),
        )
        for start in range(0, len(mine), chunk)
    ]
    out = episodes.concatenate(
        distributed.allgather_objects(episodes.concatenate(local, parallel=False)), parallel=True
    )
    res = out.results
    rewards = episode_rewards(res, cfg.rl.reward)
    for tags, reward, causes in zip(res.turn_tags, rewards, res.turn_causes):
        state.weighting.add_episode(tags, float(reward), [c for turn in causes for c in turn])
    state.weighting.update()
    state.interface.update(res.episodes, state.weighting.tag_stats)

    group_ids = np.repeat(np.arange(len(task_ids)), cfg.rl.group_size)
    advantages = np.asarray(
        rl.grpo_advantages(
            rewards, group_ids, eps=cfg.rl.adv_eps, std_normalize=cfg.rl.adv_std_normalize
        )
    )
    causes = [[c for turn in ep for c in turn] for ep in res.turn_causes]
    weights = state.weighting.weights(res.turn_tags, advantages, causes)
    weighted = np.asarray(rl.weighted_advantages(advantages, weights))
    t_update = time.perf_counter()
    rows, trained = _update_rows(cfg, weighted)
    update, gap, batch_tokens = {}, np.zeros(0), 0
    if rows.size:
        batch = trajectories.training_batch(
            [out.sequences[i] for i in rows],
            weighted[rows],
            cfg.train.length_bucket,
            group_size=cfg.rl.group_size if run.share_prompt else 0,
        )
        batch["loss_mask"][~trained] = False
        if cfg.rl.old_logprobs == "sampler":
            batch["old_logprobs"] = batch["sampler_logprobs"]
        else:
            batch["old_logprobs"] = _forward_logprobs(run, state.params, batch)
            gap = np.abs(batch["old_logprobs"] - batch["sampler_logprobs"])[batch["loss_mask"]]
        if cfg.rl.kl_coef > 0:
            batch["ref_logprobs"] = _forward_logprobs(run, ref_params, batch)
        batch_tokens = int(batch["mask"].sum() + batch.get("prompt_mask", np.zeros(0)).sum())
        update = _update(run, state, batch)
    state.step += 1
    t_end = time.perf_counter()
    rollout_metrics = _rollout_metrics(out, run.source)
    tokens = rollout_metrics["tokens_generated"]
    return {
        "rollout": rollout_metrics,
        "weights": weight_metrics(np.asarray(weights)),
        "utilities": state.weighting.metrics(),
        "interface": {**state.interface.log_record(), **state.interface.metrics()},
        "zero_adv_group_fraction": float(rl.zero_advantage_group_fraction(rewards, group_ids)),
        "reward_used_mean": float(rewards.mean()),
        **(
            {"logprob_gap_sampler_vs_recomputed": float(gap.mean()) if gap.size else 0.0}
            if cfg.rl.old_logprobs == "recompute"
            else {}
        ),
        "batch_tokens": batch_tokens,
        "update_groups": len(rows) // cfg.rl.group_size,
        "loss": update,
        "time": {
            **out.timings,
            "update_s": t_end - t_update,
            "step_s": t_end - t_start,
            "generated_tokens_per_s": tokens / max(out.timings["generate_s"], 1e-9),
        },
    }


def _fresh_state(run: Run) -> State:
    with jax.set_mesh(run.model.mesh):
        opt_state = jax.jit(run.optimizer.init, out_shardings=run.opt_state_shardings)(
            run.model.params
        )
    return State(
        0,
        run.model.params,
        opt_state,
        DiagnosisWeighting(run.config.weighting),
        LearningInterface(run.config.interface),
    )


def restore_or_init(run: Run, checkpointer: Checkpointer) -> tuple[State, bool]:
    """The state of the newest checkpoint in the work directory, or a fresh one."""
    state = _fresh_state(run)
    step = checkpointer.latest_step()
    if step is None:
        return state, False
    params, opt_state, host = checkpointer.restore(step, state.params, state.opt_state)
    weighting = DiagnosisWeighting.from_dict(run.config.weighting, host["weighting"])
    interface = LearningInterface.from_dict(run.config.interface, host["interface"])
    logging.info("resumed from %s at step %d", checkpointer.directory, host["step"])
    restored = State(host["step"], params, opt_state, weighting, interface, host["best_metric"])
    restored.last_eval = host["last_eval"]
    return restored, True


def eval_score(evaluation: dict, key: str) -> float:
    """The value of `train.best_metric` ("eval/mean" or "eval/accuracy/<category>")."""
    node: Any = {"eval": evaluation}
    for part in key.split("/"):
        if not isinstance(node, dict) or part not in node:
            raise config_lib.ConfigError(
                f"--config.train.best_metric={key!r} is not in the evaluation record "
                "(use eval/mean or eval/accuracy/<category>)"
            )
        node = node[part]
    return float(node)


def _save(checkpointer: Checkpointer, state: State, score: float | None) -> None:
    metric = float("-inf") if score is None else score
    checkpointer.save(state.step, state.params, state.opt_state, state.host_dict(), metric)


def train(config: Any, model: LoadedModel, workdir: str) -> State:
    """Runs (or resumes) SEAL training in workdir; returns the final state."""
    run = build(config, model, workdir)
    checkpointer = Checkpointer(workdir, keep=config.train.keep_checkpoints)
    writer = MetricsWriter(workdir)
    state, resumed = restore_or_init(run, checkpointer)
    # The frozen reference is the initial policy (a copy: the update donates its inputs).
    ref_params = jax.tree.map(jnp.copy, model.params) if config.rl.kl_coef > 0 else None
    last = total_steps(config, run.source)
    every = config.train.eval_every  # 0 disables evaluation altogether
    if not resumed and every:
        state.last_eval = evaluate(run, state.params, 0)
        writer.write(0, {"eval": state.last_eval})
    t0, first = time.perf_counter(), state.step
    with _pool(run, config.env.train_mode) as pool:
        while state.step < last:
            metrics = train_one_step(run, state, pool, ref_params)
            evaluated = bool(every) and (state.step % every == 0 or state.step == last)
            score = None
            if evaluated:
                state.last_eval = evaluate(run, state.params, state.step)
                score = eval_score(state.last_eval, config.train.best_metric)
                state.best_metric = max(state.best_metric, score)
                metrics["eval"] = state.last_eval
            writer.write(state.step, metrics)
            rate = (time.perf_counter() - t0) / (state.step - first)
            logging.info(
                "step %d/%d reward %.3f loss %s | %.1fs/step, ETA %.0fs",
                state.step,
                last,
                metrics["rollout"]["reward_mean"],
                f"{metrics['loss']['loss']:.4f}" if metrics["loss"] else "- (no group with signal)",
                rate,
                rate * (last - state.step),
            )
            if evaluated or state.step % config.train.checkpoint_every == 0:
                _save(checkpointer, state, score)
            if evaluated and config.train.write_report and jax.process_index() == 0:
                report.write_report(workdir)
    checkpointer.close()
    writer.close()
    logging.info("process %d: parameter checksum %s", jax.process_index(), checksum(state.params))
    return state


def checksum(params: Any) -> str:
    """A digest of the parameter values (compare runs, resumes and processes at a glance)."""
    digest = hashlib.sha256()
    for leaf in jax.tree.leaves(params):
        digest.update(np.ascontiguousarray(distributed.to_host(leaf)).tobytes())
    return digest.hexdigest()[:16]
