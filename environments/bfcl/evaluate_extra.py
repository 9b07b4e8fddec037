"""Evaluates a scripted policy on BFCL's single-turn and memory categories, offline, with the
official checkers (environments/bfcl/extra.py). A model is evaluated on them by `run.py
--mode=eval` with `--config.eval.extra_categories=...` (environments/README.md).

    python -m environments.bfcl.evaluate_extra --categories=single_turn,memory \
        --policy=oracle --workdir=workdirs/extra_oracle

Writes `metrics.json` (accuracy per category, their mean, task and error counts, the
categories that cannot run offline and why) and `transcripts.jsonl` (one line per episode,
memory conversations included) to workdir; prints the accuracies as one JSON line, and one line
on stderr per category that cannot run offline. A user's mistake (an unknown category, a work
directory that cannot be written) ends in one `error:` line on stderr and exit code 2.
"""

import json
import sys

from absl import app, flags

from environments.bfcl import extra
from environments.bfcl.evaluate import fail, parse_flags, prepare_workdir, run_episodes
from environments.policies import NoActionPolicy
from environments.rendering import PROMPT_STYLES, Renderer


def define_flags() -> None:
    """The command's flags."""
    flags.DEFINE_list(
        "categories",
        ["single_turn", "memory"],
        f"Categories or groups ({', '.join(extra.GROUPS)}), comma-separated.",
    )
    flags.DEFINE_enum("policy", "oracle", ["oracle", "noop"], "Scripted policy to evaluate.")
    flags.DEFINE_enum(
        "prompt_style", "release", list(PROMPT_STYLES), "How tools are shown (BFCL's: release)."
    )
    flags.DEFINE_string(
        "workdir", None, "Where metrics.json and transcripts.jsonl go.", required=True
    )
    flags.DEFINE_integer("limit", 0, "Evaluate only the first N scored tasks of each category.", 0)
    flags.DEFINE_integer("batch_size", 512, "Episodes run together.", 1)


def main(argv: list[str]) -> None:
    """Runs the evaluation the flags describe and writes the report."""
    del argv
    config = flags.FLAGS
    try:
        categories, unavailable = extra.resolve_categories(config.categories)
    except ValueError as e:
        fail(e)
    workdir = prepare_workdir(config.workdir)
    for category, reason in unavailable.items():
        print(f"{category}: {reason}", file=sys.stderr)
    policy = extra.ScriptedPolicy(extra.oracle_messages)
    if config.policy == "noop":
        policy = NoActionPolicy()
    renderer = Renderer(prompt_style=config.prompt_style)

    def play(pool: extra.ExtraPool, task_ids: list[str]) -> list:
        return run_episodes(policy, task_ids, pool, config.batch_size, renderer)

    results = extra.play_categories(categories, play, extra.ExtraPool(), config.limit)
    summary = extra.summarize(results, categories, unavailable)
    settings = {"policy": config.policy, "prompt_style": config.prompt_style}
    extra.write_report(workdir, results, {**settings, **summary})
    print(json.dumps({"accuracy": summary["accuracy"], "mean": summary["mean"]}))


if __name__ == "__main__":
    define_flags()
    app.run(main, flags_parser=parse_flags)
