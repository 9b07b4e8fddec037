"""Evaluates a policy on BFCL multi-turn tasks with the plain interface and official semantics.

    python -m environments.bfcl.evaluate --policy=oracle --split=eval --workdir=workdirs/eval_oracle

Writes `metrics.json` (accuracy per category, their mean, per-turn tag and cause histograms)
and `transcripts.jsonl` (one line per task: verdict, tags, causes, every message) to workdir.
"""

import collections
import json
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from absl import app, flags, logging
from tqdm import tqdm

from environments.bfcl.tasks import CATEGORIES, category_of, load_task
from environments.episode import EpisodeConfig, EpisodeResult
from environments.policies import NoActionPolicy, OraclePolicy
from environments.pool import EnvPool, PoolConfig
from environments.rendering import Message
from environments.task import ToolTask


class Policy(Protocol):
    """What the evaluator drives: started per batch, then one message per episode per step."""

    def start(self, task_ids: list[str]) -> None:
        """Prepares for a batch of episodes."""

    def act(self, observations: list[list[Message]]) -> list[str]:
        """Returns the next assistant message of every episode, given its latest observation."""


def run_episodes(
    policy: Policy, task_ids: list[str], pool: EnvPool, batch_size: int = 64
) -> list[EpisodeResult]:
    """Plays every task once with `policy` in batches on `pool`; returns the verdicts in order."""
    results = []
    for start in tqdm(range(0, len(task_ids), batch_size), desc="batches", unit="batch"):
        batch = task_ids[start : start + batch_size]
        observations = pool.reset(batch)
        policy.start(batch)
        dones = [False] * len(batch)
        while not all(dones):
            texts = policy.act(observations)
            texts = [None if done else text for text, done in zip(texts, dones)]
            observations, dones = pool.step(texts)
        results += pool.results().episodes
    return results


def summarize(results: list[EpisodeResult]) -> dict:
    """Returns accuracy per category present, their mean, the same with BFCL's irrelevance
    check (`strict_accuracy`, see EpisodeResult.strict_success), and tag and cause histograms."""
    by_category = collections.defaultdict(list)
    for result in results:
        by_category[category_of(result.task_id)].append(result)
    metrics = {
        "num_tasks": len(results),
        "accuracy": {},
        "strict_accuracy": {},
        "tag_histogram": {},
        "cause_histogram": {},
    }
    for category in [c for c in CATEGORIES if c in by_category]:
        group = by_category[category]
        metrics["accuracy"][category] = sum(r.success for r in group) / len(group)
        metrics["strict_accuracy"][category] = sum(r.strict_success for r in group) / len(group)
        tags = collections.Counter(tag for r in group for tag in r.turn_tags)
        causes = collections.Counter(c for r in group for turn in r.turn_causes for c in turn)
        metrics["tag_histogram"][category] = dict(sorted(tags.items()))
        metrics["cause_histogram"][category] = dict(sorted(causes.items()))
    accuracies = list(metrics["accuracy"].values())
    metrics["mean_accuracy"] = sum(accuracies) / len(accuracies) if accuracies else 0.0
    return metrics


def write_report(workdir: str | Path, results: list[EpisodeResult], extra: dict) -> dict:
    """Writes metrics.json and transcripts.jsonl into workdir; returns the metrics."""
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    metrics = {**extra, **summarize(results)}
    (workdir / "metrics.json").write_text(json.dumps(metrics, indent=2))
    with (workdir / "transcripts.jsonl").open("w") as file:
        for r in results:
            record = {
                "id": r.task_id,
                "success": r.success,
                "strict_success": r.strict_success,
                "turn_tags": r.turn_tags,
                "turn_causes": [sorted(causes) for causes in r.turn_causes],
                "turn_error_kinds": r.turn_error_kinds,
                "failure_reason": r.failure_reason,
                "transcript": r.transcript,
            }
            file.write(json.dumps(record, ensure_ascii=False) + "\n")
    return metrics


def make_policy(
    name: str, task_ids: list[str], load: Callable[[str], ToolTask] = load_task
) -> Policy:
    """Returns a scripted policy: "oracle" (replays the ground truth) or "noop" (never calls)."""
    if name == "oracle":
        return OraclePolicy({task_id: load(task_id) for task_id in task_ids})
    if name == "noop":
        return NoActionPolicy()
    raise ValueError(f"unknown policy {name!r}; use 'oracle' or 'noop'")


def define_flags() -> None:
    """Flags of the evaluation commands (this module's and environments.suite.evaluate's)."""
    flags.DEFINE_enum("policy", "oracle", ["oracle", "noop"], "Scripted policy to evaluate.")
    flags.DEFINE_enum("split", "eval", ["train", "eval"], "Task split.")
    flags.DEFINE_string(
        "workdir", None, "Where metrics.json and transcripts.jsonl go.", required=True
    )
    flags.DEFINE_integer("num_workers", 2, "Worker processes of the environment pool.")
    flags.DEFINE_integer("batch_size", 64, "Episodes run together.")
    flags.DEFINE_integer("max_model_calls", 20, "Assistant messages allowed per episode.")
    flags.DEFINE_integer("limit", 0, "Evaluate only the first N tasks of the split (0: all).")


def evaluate_split(env: str) -> None:
    """Runs the evaluation given by the flags on environment `env` ("bfcl" or "suite")."""
    from environments.sources import get_source

    config, source = flags.FLAGS, get_source(env)
    task_ids = source.split_ids(config.split)[: config.limit or None]
    policy = make_policy(config.policy, task_ids, source.load_task)
    episode = EpisodeConfig(mode="official", max_model_calls=config.max_model_calls)
    pool_config = PoolConfig(num_workers=config.num_workers, episode=episode)
    with EnvPool(source.load_task, pool_config) as pool:
        results = run_episodes(policy, task_ids, pool, config.batch_size)
    extra = {"env": env, "policy": config.policy, "split": config.split, "interface": "plain"}
    metrics = write_report(config.workdir, results, extra)
    logging.info("accuracy %s mean %.4f", metrics["accuracy"], metrics["mean_accuracy"])
    print(json.dumps({"accuracy": metrics["accuracy"], "mean": metrics["mean_accuracy"]}))


def main(argv: list[str]) -> None:
    """Evaluates on BFCL."""
    del argv
    evaluate_split("bfcl")


if __name__ == "__main__":
    define_flags()
    app.run(main)
