"""The episode driver: runs batches of multi-turn episodes on the rollout engine and the pool.

For a batch of tasks, G rollouts each: the pool opens every episode (system prompt with tools,
first user turn, rendered by the current interface); the prompts are tokenized once per task and
the engine generates every row's reply; each reply's text goes to the pool, which executes its
tool calls and answers with observation messages; those are tokenized with the chat template's
separators and appended to the live rows, which continue from their KV cache. Rows whose episode
is done, that exhaust the model-call budget or hit the context limit stop (and stop costing
device time). At the end the pool verifies and diagnoses every episode.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from environments.pool import BatchResults, EnvPool, batch_results
from seal_jax import rollout as rollout_lib
from seal_jax.chat import ChatFormat


@dataclasses.dataclass
class EpisodeBatch:
    """Token sequences and verdicts of B*G episodes (row r is task r // G).

    Attributes:
      task_ids: per row, its task.
      sequences: per row, the engine's token sequence (ids, loss mask, sampler log-probs).
      results: the pool's verdicts (rewards, tags, causes, transcripts).
      num_calls: per row, the model turns generated.
      stop_reasons: per row, why its last model turn stopped.
      timings: seconds spent in generation and in the environment.
    """

    task_ids: list[str]
    sequences: list[rollout_lib.Episode]
    results: BatchResults
    num_calls: np.ndarray
    stop_reasons: list[str]
    timings: dict[str, float]


def _task_opening(openings: Sequence[list], task_id: str) -> list:
    """The opening of a task's first row that started (rows whose worker was lost have none)."""
    for opening in openings:
        if opening:
            return opening
    raise RuntimeError(
        f"task {task_id}: none of its episodes could start (environment workers lost)"
    )


def _reply_text(chat: ChatFormat, ids: Sequence[int]) -> str:
    """The assistant message text of a sampled reply (without its end-of-turn token)."""
    ids = list(ids)
    if chat.turn_closed(ids):
        ids = ids[:-1]
    return chat.tokenizer.decode(ids, skip_special_tokens=False)


def run_episodes(
    engine: rollout_lib.RolloutEngine,
    chat: ChatFormat,
    pool: EnvPool,
    task_ids: Sequence[str],
    num_samples: int,
    seed: int,
    renderer: Any = None,
    max_new_tokens: int | None = None,
) -> EpisodeBatch:
    """Runs `num_samples` episodes of every task to the end; see the module docstring."""
    rows = [t for t in task_ids for _ in range(num_samples)]
    timings = {"generate_s": 0.0, "env_s": 0.0}
    t0 = time.perf_counter()
    openings = pool.reset(rows, renderer)
    prompts = [
        chat.prompt_ids(_task_opening(openings[i * num_samples : (i + 1) * num_samples], task))
        for i, task in enumerate(task_ids)
    ]
    limit = engine.config.context_limit - engine.config.max_new_tokens
    for task, prompt in zip(task_ids, prompts):
        if len(prompt) > limit:
            raise ValueError(
                f"task {task}: prompt of {len(prompt)} tokens leaves no room for a reply "
                f"(context_limit - max_new_tokens = {limit})"
            )
    timings["env_s"] += time.perf_counter() - t0

    t0 = time.perf_counter()
    rollout = engine.start(prompts, num_samples=num_samples, seed=seed)
    turns = rollout.generate(max_new_tokens=max_new_tokens)
    timings["generate_s"] += time.perf_counter() - t0
    num_calls = np.zeros(len(rows), np.int32)
    stop_reasons = [rollout_lib.STOP] * len(rows)
    done = np.zeros(len(rows), bool)
    while turns:
        t0 = time.perf_counter()
        texts: list[str | None] = [None] * len(rows)
        for r, turn in turns.items():
            stop_reasons[r] = turn.stop_reason
            if turn.stop_reason == rollout_lib.CONTEXT_LIMIT and not turn.ids:
                continue  # no reply fits: the pool ends this episode as it stands
            num_calls[r] += 1
            texts[r] = _reply_text(chat, turn.ids)
        pool.stop([r for r in turns if texts[r] is None])
        observations, done = pool.step(texts)
        env_ids, cut = {}, []
        for r, turn in turns.items():
            if done[r] or texts[r] is None:
                continue
            if turn.stop_reason == rollout_lib.CONTEXT_LIMIT:
                cut.append(r)  # the reply filled the context: nothing more can follow
                continue
            closed = chat.turn_closed(turn.ids)
            env_ids[r] = chat.env_ids(observations[r], turn_closed=closed)
        pool.stop(cut)
        timings["env_s"] += time.perf_counter() - t0
        if not env_ids:
            break
        t0 = time.perf_counter()
        turns = rollout.generate(env_ids, max_new_tokens=max_new_tokens)
        timings["generate_s"] += time.perf_counter() - t0
    t0 = time.perf_counter()
    results = pool.results()
    timings["env_s"] += time.perf_counter() - t0
    return EpisodeBatch(rows, rollout.episodes(), results, num_calls, stop_reasons, timings)


def concatenate(batches: Sequence[EpisodeBatch], parallel: bool) -> EpisodeBatch:
    """One batch from several, rows in order; timings add up (sequential chunks) or take the
    maximum (`parallel`: the same step on several hosts)."""
    if len(batches) == 1:
        return batches[0]
    combine = max if parallel else sum
    return EpisodeBatch(
        task_ids=[t for b in batches for t in b.task_ids],
        sequences=[q for b in batches for q in b.sequences],
        results=batch_results([e for b in batches for e in b.results.episodes]),
        num_calls=np.concatenate([b.num_calls for b in batches]),
        stop_reasons=[r for b in batches for r in b.stop_reasons],
        timings={k: combine(b.timings[k] for b in batches) for k in batches[0].timings},
    )
