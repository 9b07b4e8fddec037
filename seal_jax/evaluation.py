"""Greedy evaluation of a policy on the evaluation split: the plain interface, under each
evaluation protocol of `train.eval_protocols` (environments.episode.PROTOCOLS: `release`, the
SEAL release's validation environment, whose numbers the paper reports; `official`, BFCL's
runner).

The trainer runs it before training, every `train.eval_every` steps and at the end;
`run.py --mode=eval` runs it once. Per protocol, the summary is the evaluation commands' own
(`environments.summary`): accuracy per category and its `mean`, the same under BFCL's
irrelevance check (`strict_accuracy`, `strict_mean`), and tag and cause counts; the record
holds the first protocol's at its top and every protocol's under "protocols"
(`environments.summary.by_protocol`).
"""

from __future__ import annotations

import time
from typing import Any

from absl import logging

from environments.rendering import Renderer
from environments.sources import TaskSource
from environments.summary import by_protocol, summarize
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
    """Runs every evaluation task once per protocol, greedily; returns the record
    (`environments.summary.by_protocol`) plus `seconds`.

    Args:
      engine: a greedy rollout engine; params: the policy; chat: its chat format.
      source: the tasks; config: the run's config (train.eval_limit, train.eval_batch_tasks,
        train.eval_protocols, interface.prompt_style, env settings); step: the training step,
        for the log line.
    """
    ids = eval_task_ids(source, config.train.eval_limit)
    renderer = Renderer(prompt_style=config.interface.prompt_style)
    t0 = time.perf_counter()
    summaries = {}
    for protocol in config.train.eval_protocols:
        with episodes.open_pool(source, config.env, protocol) as pool:
            batch = episodes.collect_episodes(
                engine,
                params,
                chat,
                pool,
                task_ids=ids,
                num_samples=1,
                seed=step,
                chunk_tasks=config.train.eval_batch_tasks,
                renderer=renderer,
            )
        summaries[protocol] = summary = summarize(batch.results, source.categories)
        logging.info(
            "eval at step %d (%s protocol): mean %.4f %s (strict mean %.4f)",
            step,
            protocol,
            summary["mean"],
            summary["accuracy"],
            summary["strict_mean"],
        )
    return {**by_protocol(summaries), "seconds": time.perf_counter() - t0}
