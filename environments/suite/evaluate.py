"""Evaluates a scripted policy on the suite with the plain interface and official semantics.

    python -m environments.suite.evaluate --policy=oracle --split=eval --workdir=workdirs/suite

Writes the same `metrics.json` and `transcripts.jsonl` as `environments.bfcl.evaluate`, whose
episode loop and report writer it reuses.
"""

import json

from absl import app, flags, logging

from environments.bfcl.evaluate import Policy, run_episodes, write_report
from environments.episode import EpisodeConfig
from environments.policies import NoActionPolicy, OraclePolicy
from environments.pool import EnvPool, PoolConfig
from environments.suite import load_task, split_ids

POLICIES = ("oracle", "noop")


def make_policy(name: str, task_ids: list[str]) -> Policy:
    """Returns a scripted policy: "oracle" (replays the ground truth) or "noop" (never calls)."""
    if name == "oracle":
        return OraclePolicy({task_id: load_task(task_id) for task_id in task_ids})
    if name == "noop":
        return NoActionPolicy()
    raise ValueError(f"unknown policy {name!r}; use one of {POLICIES}")


def _define_flags() -> None:
    flags.DEFINE_enum("policy", "oracle", list(POLICIES), "Scripted policy to evaluate.")
    flags.DEFINE_enum("split", "eval", ["train", "eval"], "Task split of the generated suite.")
    flags.DEFINE_string(
        "workdir", None, "Where metrics.json and transcripts.jsonl go.", required=True
    )
    flags.DEFINE_integer("num_workers", 2, "Worker processes of the environment pool.")
    flags.DEFINE_integer("batch_size", 64, "Episodes run together.")
    flags.DEFINE_integer("max_model_calls", 20, "Assistant messages allowed per episode.")
    flags.DEFINE_integer("limit", 0, "Evaluate only the first N tasks of the split (0: all).")


def main(argv: list[str]) -> None:
    """Runs the evaluation given by the flags."""
    del argv
    config = flags.FLAGS
    task_ids = split_ids(config.split)[: config.limit or None]
    policy = make_policy(config.policy, task_ids)
    episode = EpisodeConfig(mode="official", max_model_calls=config.max_model_calls)
    with EnvPool(load_task, PoolConfig(num_workers=config.num_workers, episode=episode)) as pool:
        results = run_episodes(policy, task_ids, pool, config.batch_size)
    extra = {"policy": config.policy, "split": config.split, "interface": "plain", "env": "suite"}
    metrics = write_report(config.workdir, results, extra)
    logging.info("accuracy %s mean %.4f", metrics["accuracy"], metrics["mean_accuracy"])
    print(json.dumps({"accuracy": metrics["accuracy"], "mean": metrics["mean_accuracy"]}))


if __name__ == "__main__":
    _define_flags()
    app.run(main)
