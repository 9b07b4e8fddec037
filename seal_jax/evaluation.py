"""Greedy evaluation of a policy on the evaluation split: plain interface, official semantics.

The trainer runs it before training, every `train.eval_every` steps and at the end;
`run.py --mode=eval` runs it once. The summary is the evaluation commands' own
(`environments.summary`): accuracy per category and its `mean`, the same under BFCL's
irrelevance check (`strict_accuracy`, `strict_mean`), and tag and cause counts.
"""

from __future__ import annotations

import time
from typing import Any

from absl import logging

from environments.sources import TaskSource
from environments.summary import summarize
from seal_jax import episodes, rollout
from seal_jax.chat import ChatFormat


def eval_task_ids(source: TaskSource, limit: int) -> list[str]:
    """The evaluation split, or its first `limit` tasks taken round-robin over categories."""
    ids = source.split_ids("eval")
    if not limit:
        return ids
    by_category = [[i for i in ids if source.category_of(i) == c] for c in source.categories]
    mixed = [i for group in zip(*by_category) for i in group]
    return mixed[:limit]


def evaluate(
    engine: rollout.RolloutEngine,
    params: Any,
    chat: ChatFormat,
    source: TaskSource,
    config: Any,
    step: int,
) -> dict:
    """Runs every evaluation task once, greedily, and returns its summary plus `seconds`.

    Args:
      engine: a greedy rollout engine; params: the policy; chat: its chat format.
      source: the tasks; config: the run's config (train.eval_limit, train.eval_batch_tasks,
        env settings); step: the training step, for the log line.
    """
    ids = eval_task_ids(source, config.train.eval_limit)
    t0 = time.perf_counter()
    with episodes.open_pool(source, config.env, "official") as pool:
        batch = episodes.collect_episodes(
            engine,
            params,
            chat,
            pool,
            task_ids=ids,
            num_samples=1,
            seed=step,
            chunk_tasks=config.train.eval_batch_tasks,
        )
    metrics = {**summarize(batch.results, source.categories), "seconds": time.perf_counter() - t0}
    logging.info(
        "eval at step %d: mean %.4f %s (strict mean %.4f)",
        step,
        metrics["mean"],
        metrics["accuracy"],
        metrics["strict_mean"],
    )
    return metrics
