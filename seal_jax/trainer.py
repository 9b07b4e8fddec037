"""The SEAL run and its loop (docs/method.md), driven by `run.py --mode=train`.

One step (`train_one_step`):
  tasks       <- B training tasks (a seeded permutation per epoch; the position follows the step)
  episodes    <- G rollouts per task through the CURRENT interface (`seal_jax.episodes`)
  feedback    <- rewards (`environments.rewards`); the failure profile C_t; tag utilities rho
                 and per-trajectory weights (`environments.weighting`); the interface Omega
  advantages  <- GRPO per group, times the weights (`seal_jax.rl`)
  update      <- PPO-clip + KL on the model's tokens (`seal_jax.update`)
Evaluation (`seal_jax.evaluation`: greedy, plain interface, official semantics) runs before
training, every `train.eval_every` steps and at the end. Checkpoints carry everything needed to
continue bit-for-bit; restarting the same command on the same work directory resumes. A stop
signal (SIGTERM: a preemption notice; SIGINT) ends the run at the next safe point with the last
completed step saved (`seal_jax.preemption`).
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import os
import time
from typing import Any

import jax
import numpy as np
from absl import logging

from environments.interface import LearningInterface
from environments.pool import EnvPool
from environments.profile import FailureProfile
from environments.rewards import episode_rewards
from environments.sources import TaskSource, get_source
from environments.weighting import DiagnosisWeighting, weight_metrics
from seal_jax import config as config_lib
from seal_jax import distributed, episodes, evaluation, preemption, report, rl, rollout, weight_sync
from seal_jax import update as update_lib
from seal_jax.chat import ChatFormat, run_chat_format
from seal_jax.checkpointing import Checkpointer
from seal_jax.metrics import MetricsWriter
from seal_jax.models import LoadedModel
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
    updater: update_lib.Updater


@dataclasses.dataclass
class State:
    """What a checkpoint restores: device arrays plus plain host data."""

    step: int
    params: Any
    opt_state: Any
    profile: FailureProfile
    weighting: DiagnosisWeighting
    interface: LearningInterface
    best_metric: float = float("-inf")
    last_eval: dict = dataclasses.field(default_factory=dict)

    def host_dict(self) -> dict:
        """The JSON part of a checkpoint."""
        return {
            "step": self.step,
            "profile": self.profile.to_dict(),
            "weighting": self.weighting.to_dict(),
            "interface": self.interface.to_dict(),
            "best_metric": self.best_metric,
            "last_eval": self.last_eval,
        }


# ---- the task schedule ---------------------------------------------------------------------


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


# ---- building the run ----------------------------------------------------------------------


def _engine(
    model: LoadedModel, config: Any, chat: ChatFormat, sampling: SamplingParams, max_new: int
) -> rollout.RolloutEngine:
    """A rollout engine for the policy: on the trainer's mesh, or on this process's chips in the
    sampling layout (`rollout.sampler_tensor`, `seal_jax.weight_sync`; always on several hosts,
    whose rollouts are host-local)."""
    layout = weight_sync.sampling_layout(config.rollout.sampler_tensor, model.compute_dtype)
    mesh = layout.mesh if layout else model.mesh
    engine_config = rollout.EngineConfig.from_config(
        config.rollout, max_new, chat.stop_ids, sampling
    )
    engine = rollout.RolloutEngine(model.config, mesh, engine_config, model.compute_dtype, layout)
    if config.rollout.slots % engine.batch_shards:
        raise config_lib.ConfigError(
            f"--config.rollout.slots={config.rollout.slots} must be a multiple of the rows the "
            f"rollout mesh splits a batch into ({engine.batch_shards})"
        )
    return engine


def build(config: Any, model: LoadedModel, workdir: str) -> Run:
    """Tokenizer, task source, rollout engines and the compiled update."""
    chat = run_chat_format(model.tokenizer(), config)
    r = config.rollout
    sampling = SamplingParams("sample", r.temperature, r.top_k, r.top_p)
    greedy, eval_tokens = SamplingParams("greedy"), config.train.eval_max_new_tokens
    return Run(
        config=config,
        workdir=workdir,
        model=model,
        chat=chat,
        source=get_source(config.env.name, config.env.bfcl_split),
        train_engine=_engine(model, config, chat, sampling, r.max_new_tokens),
        eval_engine=_engine(model, config, chat, greedy, eval_tokens),
        updater=update_lib.build_updater(config, model),
    )


def evaluate(run: Run, params: Any, step: int) -> dict:
    """The evaluation summary of `params` (`seal_jax.evaluation.evaluate`); its episodes go to
    <workdir>/eval_transcripts."""
    transcripts = os.path.join(run.workdir, "eval_transcripts")
    return evaluation.evaluate(
        run.eval_engine, params, run.chat, run.source, run.config, step, transcripts
    )


# ---- one step ------------------------------------------------------------------------------


def train_one_step(run: Run, state: State, pool: EnvPool, ref_params: Any) -> dict:
    """Runs step `state.step` of SEAL and advances the state; returns the step's metrics.

    The state changes only once the step is complete (its host parts are worked on as copies),
    so a step abandoned midway (`seal_jax.preemption`: in its rollout or, on one host, its
    update) leaves the state of the last completed step."""
    cfg, t_start = run.config, time.perf_counter()
    profile, weighting, interface = copy.deepcopy((state.profile, state.weighting, state.interface))
    if state.step and state.step % steps_per_epoch(cfg, run.source) == 0:
        profile.end_epoch()

    # Episodes: G rollouts of each of the step's tasks, through the current interface.
    task_ids = step_tasks(cfg, run.source, state.step)
    batch = episodes.collect_episodes(
        run.train_engine,
        state.params,
        run.chat,
        pool,
        task_ids=task_ids,
        num_samples=cfg.rl.group_size,
        seed=cfg.seed * 1_000_003 + state.step,
        renderer=interface.renderer(),
        chunk_tasks=cfg.rollout.micro_batch_tasks,
        slots=cfg.rollout.slots,
        abandonable=True,
    )

    # Feedback: rewards -> failure profile -> utilities and weights; the interface evolves.
    rewards = episode_rewards(batch.results, cfg.rl.reward)
    profile.add(batch.results, rewards)
    weighting.update(profile)
    interface.update(batch.results, profile)
    weights = weighting.weights(batch.results)

    # Advantages: GRPO within each task's group, scaled by the diagnosis weights.
    group_ids = np.repeat(np.arange(len(task_ids)), cfg.rl.group_size)
    advantages = rl.grpo_advantages(
        rewards, group_ids, eps=cfg.rl.adv_eps, std_normalize=cfg.rl.adv_std_normalize
    )
    weighted = np.asarray(rl.weighted_advantages(advantages, weights, cfg.weighting.mode))

    # Update: PPO-clip + KL on the sampled tokens (of each episode's first
    # train.max_response_tokens ids after its prompt).
    t_update = time.perf_counter()
    sequences = episodes.training_sequences(
        batch.sequences, run.chat, cfg.train.max_response_tokens
    )
    with preemption.abandonable(collective=True):
        params, opt_state, update = update_lib.update_policy(
            run.updater, state.params, state.opt_state, sequences, weighted, ref_params
        )

    # The step is complete: the new state.
    state.step, state.params, state.opt_state = state.step + 1, params, opt_state
    state.profile, state.weighting, state.interface = profile, weighting, interface
    seconds = {"update_s": time.perf_counter() - t_update, "step_s": time.perf_counter() - t_start}
    return _step_metrics(state, batch, rewards, group_ids, weights, update, seconds)


def _step_metrics(
    state: State,
    batch: episodes.EpisodeBatch,
    rewards: np.ndarray,
    group_ids: np.ndarray,
    weights: np.ndarray,
    update: dict,
    seconds: dict,
) -> dict:
    """The record of one step for the metric writer."""
    rollout_metrics = episodes.rollout_metrics(batch)
    generate_s = max(batch.timings["generate_s"], 1e-9)
    return {
        "rollout": rollout_metrics,
        "weights": weight_metrics(weights),
        # Per trajectory, for analyses across runs (benchmarks/seal_vs_baselines.py).
        "trajectories": {
            "category": [r.category for r in batch.results],
            "tags": [list(r.turn_tags) for r in batch.results],
            "weight": np.asarray(weights, float).tolist(),
        },
        "utilities": state.weighting.metrics(),
        "interface": {**state.interface.log_record(), **state.interface.metrics()},
        "zero_adv_group_fraction": float(rl.zero_advantage_group_fraction(rewards, group_ids)),
        "reward_used_mean": float(rewards.mean()),
        **update,
        "time": {
            **batch.timings,
            **seconds,
            "generated_tokens_per_s": rollout_metrics["tokens_generated"] / generate_s,
        },
    }


# ---- state, checkpoints and the loop -------------------------------------------------------


def initial_state(run: Run) -> State:
    """Step 0: the loaded policy, a fresh optimizer state, empty profile, rho0, plain interface."""
    return State(
        0,
        run.model.params,
        run.updater.init_opt_state(run.model.params),
        FailureProfile(),
        DiagnosisWeighting(run.config.weighting),
        LearningInterface(run.config.interface),
    )


def restore_or_init(run: Run, checkpointer: Checkpointer) -> tuple[State, bool]:
    """The state of the newest checkpoint in the work directory that reads back whole (newer
    ones that do not are reported and deleted: `Checkpointer.restore_latest`), or a fresh one."""
    state = initial_state(run)
    latest = checkpointer.restore_latest(state.params, state.opt_state, discard_unreadable=True)
    if latest is None:
        return state, False
    _, params, opt_state, host = latest
    logging.info("resumed from %s at step %d", checkpointer.directory, host["step"])
    restored = State(
        host["step"],
        params,
        opt_state,
        FailureProfile.from_dict(host["profile"]),
        DiagnosisWeighting.from_dict(run.config.weighting, host["weighting"]),
        LearningInterface.from_dict(run.config.interface, host["interface"]),
        host["best_metric"],
    )
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


def _save(checkpointer: Checkpointer, state: State, score: float | None) -> float:
    """Saves the state; returns the seconds the save blocked the loop."""
    metric = float("-inf") if score is None else score
    return checkpointer.save(state.step, state.params, state.opt_state, state.host_dict(), metric)


def train(config: Any, model: LoadedModel, workdir: str) -> State:
    """Runs (or resumes) SEAL training in workdir; returns the final state.

    Raises:
      preemption.Preempted: a stop signal came (here or on another host); the last completed
        step is saved and on disk, the environment pool closed, and the message says so.
    """
    run = build(config, model, workdir)
    keep, asynchronous = config.train.keep_checkpoints, config.train.async_checkpoints
    with preemption.handling(), Checkpointer(workdir, keep, asynchronous) as checkpointer:
        state, resumed = restore_or_init(run, checkpointer)
        with MetricsWriter(workdir, keep_through=state.step if resumed else -1) as writer:
            try:
                _run_steps(run, state, resumed, checkpointer, writer)
            except preemption.Preempted as stop:
                saved = _save_completed(checkpointer, state)
                raise preemption.Preempted(
                    f"stopped by {preemption.signal_name()} at step {state.step} ({stop}): "
                    f"{saved}; rerun the same command to continue"
                ) from None
    logging.info("process %d: parameter checksum %s", jax.process_index(), checksum(state.params))
    return state


def _run_steps(
    run: Run, state: State, resumed: bool, checkpointer: Checkpointer, writer: MetricsWriter
) -> None:
    """The loop: evaluate, then step, evaluate and save until the last step (or a stop)."""
    config = run.config
    # The frozen KL reference: the initial policy, in the compute dtype.
    ref_params = None
    if config.rl.kl_coef > 0:
        on_host = config.rl.reference_on_host
        ref_params = update_lib.frozen_reference(run.model.params, run.model.compute_dtype, on_host)
    last = total_steps(config, run.source)
    every = config.train.eval_every  # 0 disables evaluation altogether
    if not resumed and every:
        state.last_eval = evaluate(run, state.params, 0)
        writer.write(0, {"eval": state.last_eval})
    t0, first = time.perf_counter(), state.step
    with episodes.open_pool(run.source, config.env, config.env.train_mode) as pool:
        while state.step < last and not preemption.agreed():  # every host stops at one step
            metrics = train_one_step(run, state, pool, ref_params)
            evaluated = bool(every) and (state.step % every == 0 or state.step == last)
            score = None
            if evaluated:
                state.last_eval = evaluate(run, state.params, state.step)
                score = eval_score(state.last_eval, config.train.best_metric)
                state.best_metric = max(state.best_metric, score)
                metrics["eval"] = state.last_eval
            if evaluated or state.step % config.train.checkpoint_every == 0:
                metrics["time"]["checkpoint_blocking_s"] = _save(checkpointer, state, score)
            writer.write(state.step, metrics)
            _log_step(state.step, last, metrics, (time.perf_counter() - t0) / (state.step - first))
            if evaluated and config.train.write_report and jax.process_index() == 0:
                report.write_report(run.workdir)
    if state.step < last:
        raise preemption.Preempted("the step in flight finished")


def _log_step(step: int, last: int, metrics: dict, rate: float) -> None:
    """One progress line: reward, loss, time per step, ETA, and a save's blocking time."""
    loss = metrics["loss"]
    saved = metrics["time"].get("checkpoint_blocking_s")
    logging.info(
        "step %d/%d reward %.3f loss %s | %.1fs/step, ETA %.0fs%s",
        step,
        last,
        metrics["rollout"]["reward_mean"],
        f"{loss['loss']:.4f}" if loss else "- (no group with signal)",
        rate,
        rate * (last - step),
        "" if saved is None else f" | checkpoint {step}: {saved:.2f}s blocking",
    )


def _save_completed(checkpointer: Checkpointer, state: State) -> str:
    """Saves the last completed step unless its checkpoint exists; says what was saved."""
    where = f"in {checkpointer.directory}"
    if state.step == 0:
        return "no step was completed, nothing saved"
    if checkpointer.latest_step() != state.step:
        _save(checkpointer, state, None)
    return f"checkpoint {state.step} saved {where}"


def checksum(params: Any) -> str:
    """A digest of the parameter values (compare runs, resumes and processes at a glance)."""
    digest = hashlib.sha256()
    for leaf in jax.tree.leaves(params):
        digest.update(np.ascontiguousarray(distributed.to_host(leaf)).tobytes())
    return digest.hexdigest()[:16]
