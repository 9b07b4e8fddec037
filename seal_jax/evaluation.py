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

`evaluate_extra` runs the same greedy policy on BFCL's single-turn and memory categories named
in `eval.extra_categories` (environments/bfcl/extra.py), for `run.py --mode=eval`.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import time
from typing import Any

import jax
from absl import logging
from etils import epath

from environments.bfcl import extra
from environments.rendering import Renderer
from environments.sources import TaskSource
from environments.summary import by_protocol, summarize
from seal_jax import episodes, rollout
from seal_jax.chat import ChatFormat
from seal_jax.config import ConfigError


def eval_task_ids(source: TaskSource, limit: int, split: str = "eval") -> list[str]:
    """The evaluation split (or `split`), or its first `limit` tasks taken round-robin over
    categories."""
    ids = source.split_ids(split)
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
    transcripts_dir: str | None = None,
) -> dict:
    """Runs every evaluation task once per protocol, greedily; returns the record
    (`environments.summary.by_protocol`) plus `seconds`.

    Args:
      engine: a greedy rollout engine; params: the policy; chat: its chat format.
      source: the tasks; config: the run's config (train.eval_limit, train.eval_batch_tasks,
        train.eval_protocols, interface.prompt_style, env settings); step: the training step,
        for the log line and the transcripts' file name.
      transcripts_dir: where to write every episode, one JSON line each, as
        `step<step>_<protocol>.jsonl` (process 0; None: nowhere).
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
                slots=config.rollout.slots,
                renderer=renderer,
            )
        summaries[protocol] = summary = summarize(batch.results, source.categories)
        if transcripts_dir is not None and jax.process_index() == 0:
            write_transcripts(epath.Path(transcripts_dir) / f"step{step}_{protocol}.jsonl", batch)
        logging.info(
            "eval at step %d (%s protocol): mean %.4f %s (strict mean %.4f)",
            step,
            protocol,
            summary["mean"],
            summary["accuracy"],
            summary["strict_mean"],
        )
    return {**by_protocol(summaries), "seconds": time.perf_counter() - t0}


def write_transcripts(path: epath.Path, batch: episodes.EpisodeBatch) -> None:
    """One JSON line per episode of batch at path: task, category, success, the tag and causes
    of each turn, why it ended early (if it did) and every message, system prompt first."""
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [
        json.dumps(
            {
                "id": r.task_id,
                "category": r.category,
                "success": r.success,
                "turn_tags": r.turn_tags,
                "turn_causes": [sorted(c) for c in r.turn_causes],
                "failure_reason": r.failure_reason,
                "transcript": r.transcript,
            },
            ensure_ascii=False,
        )
        for r in batch.results
    ]
    path.write_text("\n".join(lines) + "\n")


def extra_categories(config: Any) -> tuple[list[str], dict[str, str]]:
    """The categories of `eval.extra_categories` that run offline, and those that cannot (with
    why). Raises ConfigError for an unknown name (the message lists the valid ones)."""
    try:
        return extra.resolve_categories(config.eval.extra_categories)
    except ValueError as e:
        raise ConfigError(f"--config.eval.extra_categories: {e}") from e


def evaluate_extra(
    engine: rollout.RolloutEngine,
    params: Any,
    chat: ChatFormat,
    config: Any,
    step: int,
    out_dir: str,
) -> dict:
    """Runs the policy greedily once on every scored task of the `eval.extra_categories` (and
    the memory conversations before them), tools shown in `interface.prompt_style`; writes
    metrics.json and transcripts.jsonl (one line per episode) to `out_dir` (process 0).

    Returns:
      the summary (environments.bfcl.extra.summarize) plus `seconds`. A task whose prompt
      leaves no room for a reply fails alone, with the reason as its `failure_reason`.
    """
    categories, unavailable = extra_categories(config)
    # As generate_episodes shows them: the policy's tool format.
    view = Renderer(prompt_style=config.interface.prompt_style, tool_format=chat.tool_format)
    t0 = time.perf_counter()
    play = functools.partial(_play_in_context, engine, params, chat, view, config, step)
    results = extra.play_categories(categories, play, extra.ExtraPool())
    summary = {**extra.summarize(results, categories, unavailable), "step": step}
    if jax.process_index() == 0:
        extra.write_report(out_dir, results, summary)
    logging.info(
        "extra categories at step %d: mean %.4f %s", step, summary["mean"], summary["accuracy"]
    )
    return {**summary, "seconds": time.perf_counter() - t0}


def _play_in_context(
    engine: rollout.RolloutEngine,
    params: Any,
    chat: ChatFormat,
    view: Renderer,
    config: Any,
    step: int,
    pool: extra.ExtraPool,
    task_ids: list[str],
) -> list:
    """Plays the tasks on the engine, greedily, once each; a task that cannot start (its
    opening raised, or its prompt leaves no room for a reply) fails alone, as it stands."""
    openings = pool.reset(task_ids, view)
    pool.stop(list(range(len(task_ids))))
    results = pool.results()
    limit = engine.config.context_limit - engine.config.max_new_tokens
    playable = []
    for b, opening in enumerate(openings):
        size = len(chat.prompt_ids(opening)) if opening else 0  # []: its opening raised
        if size > limit:
            reason = f"prompt of {size} tokens leaves no room for a reply ({limit} fit)"
            results[b] = dataclasses.replace(results[b], failure_reason=reason)
        elif opening:
            playable.append(b)
    if playable:
        batch = episodes.collect_episodes(
            engine,
            params,
            chat,
            pool,
            task_ids=[task_ids[b] for b in playable],
            num_samples=1,
            seed=step,
            chunk_tasks=config.train.eval_batch_tasks,
            renderer=view,
        )
        for b, result in zip(playable, batch.results):
            results[b] = result
    return results
