"""Evaluates a policy on BFCL multi-turn tasks with the plain interface under one evaluation
protocol: `--protocol=release` (default; the SEAL release's validation environment, whose numbers
the paper reports) or `--protocol=official` (BFCL's runner); docs/protocol.md. Tools are shown
in the release's prompt style (environments/rendering.py).

    python -m environments.bfcl.evaluate --policy=oracle --split=eval --workdir=workdirs/eval_oracle

Writes `metrics.json` (accuracy per category, their mean, per-turn tag and cause histograms:
`environments.summary.summarize`) and `transcripts.jsonl` (one line per task: verdict, tags,
causes, every message) to workdir. A user's mistake (a bad flag value, a work directory that
cannot be written) ends in one `error:` line on stderr and exit code 2.
"""

import json
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn, Protocol

from absl import app, flags, logging
from tqdm import tqdm

from environments.bfcl.tasks import SPLITS, load_task
from environments.episode import PROTOCOLS, EpisodeConfig, EpisodeResult
from environments.policies import NoActionPolicy, OraclePolicy
from environments.pool import EnvPool, PoolConfig
from environments.rendering import Message, Renderer
from environments.summary import write_report
from environments.task import ToolTask


class Policy(Protocol):
    """What the evaluator drives: started per batch, then one message per episode per step."""

    def start(self, task_ids: list[str]) -> None:
        """Prepares for a batch of episodes."""

    def act(self, observations: list[list[Message]]) -> list[str]:
        """Returns the next assistant message of every episode, given its latest observation."""


def run_episodes(
    policy: Policy,
    task_ids: list[str],
    pool: EnvPool,
    batch_size: int = 64,
    renderer: Renderer | None = None,
) -> list[EpisodeResult]:
    """Plays every task once with `policy` in batches on `pool`, shown through `renderer` (None:
    the plain `Renderer`); returns the verdicts in order."""
    results = []
    for start in tqdm(range(0, len(task_ids), batch_size), desc="batches", unit="batch"):
        batch = task_ids[start : start + batch_size]
        observations = pool.reset(batch, renderer)
        policy.start(batch)
        dones = [False] * len(batch)
        while not all(dones):
            texts = policy.act(observations)
            texts = [None if done else text for text, done in zip(texts, dones)]
            observations, dones = pool.step(texts)
        results += pool.results()
    return results


def make_policy(
    name: str, task_ids: list[str], load: Callable[[str], ToolTask] = load_task
) -> Policy:
    """Returns a scripted policy: "oracle" (replays the ground truth) or "noop" (never calls)."""
    if name == "oracle":
        return OraclePolicy({task_id: load(task_id) for task_id in task_ids})
    if name == "noop":
        return NoActionPolicy()
    raise ValueError(f"unknown policy {name!r}; use 'oracle' or 'noop'")


def fail(message: str) -> NoReturn:
    """Prints one `error:` line on stderr and exits with status 2 (a user's mistake)."""
    print(f"error: {' '.join(str(message).split())}", file=sys.stderr)
    sys.exit(2)


def parse_flags(argv: list[str]) -> list[str]:
    """absl flag parsing that reports a bad, missing or stray flag as one `error:` line."""
    try:
        rest = flags.FLAGS(argv)
    except flags.Error as e:
        fail(e)
    if len(rest) > 1:
        fail(f"unexpected argument(s) {' '.join(rest[1:])!r}: flags are --name=value")
    return rest


def prepare_workdir(workdir: str) -> Path:
    """Creates the work directory and checks that files can be written in it."""
    path = Path(workdir).expanduser()
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as e:
        fail(f"cannot write to --workdir={workdir}: {e.strerror or e}")
    return path


def define_flags() -> None:
    """Flags of the evaluation commands (this module's and environments.suite.evaluate's)."""
    flags.DEFINE_enum("policy", "oracle", ["oracle", "noop"], "Scripted policy to evaluate.")
    flags.DEFINE_enum("split", "eval", ["train", "eval"], "Task split.")
    flags.DEFINE_enum(
        "protocol",
        PROTOCOLS[0],
        list(PROTOCOLS),
        "Evaluation protocol (environments/episode.py): release, the SEAL release's validation "
        "environment (the paper's numbers), or official, BFCL's runner.",
    )
    flags.DEFINE_enum(
        "bfcl_split",
        SPLITS[0],
        list(SPLITS),
        "Which 400/400 BFCL split (environments/bfcl/tasks.py: SPLIT_FILES): release, the "
        "official SEAL release's, or seeded, the project's own draw. The suite ignores it.",
    )
    flags.DEFINE_string(
        "workdir", None, "Where metrics.json and transcripts.jsonl go.", required=True
    )
    flags.DEFINE_integer("num_workers", 2, "Worker processes of the environment pool.", 1)
    flags.DEFINE_integer("batch_size", 64, "Episodes run together.", 1)
    flags.DEFINE_integer("max_model_calls", 20, "Assistant messages allowed per episode.", 1)
    flags.DEFINE_integer("limit", 0, "Evaluate only the first N tasks of the split (0: all).", 0)


def evaluate_split(env: str, prompt_style: str = "chat_template") -> None:
    """Runs the evaluation given by the flags on environment `env` ("bfcl" or "suite"), tools
    shown in `prompt_style` (environments.rendering.PROMPT_STYLES)."""
    from environments.sources import get_source

    config = flags.FLAGS
    source = get_source(env, config.bfcl_split)
    workdir = prepare_workdir(config.workdir)
    task_ids = source.split_ids(config.split)[: config.limit or None]
    policy = make_policy(config.policy, task_ids, source.load_task)
    episode = EpisodeConfig(mode=config.protocol, max_model_calls=config.max_model_calls)
    pool_config = PoolConfig(num_workers=config.num_workers, episode=episode)
    renderer = Renderer(prompt_style=prompt_style)
    with EnvPool(source.load_task, pool_config) as pool:
        results = run_episodes(policy, task_ids, pool, config.batch_size, renderer)
    extra = {"env": env, "policy": config.policy, "split": config.split, "interface": "plain"}
    extra |= {"protocol": config.protocol, "prompt_style": prompt_style}
    if env == "bfcl":
        extra["bfcl_split"] = config.bfcl_split
    metrics = write_report(workdir, results, extra, source.categories)
    logging.info("accuracy %s mean %.4f", metrics["accuracy"], metrics["mean"])
    print(json.dumps({"accuracy": metrics["accuracy"], "mean": metrics["mean"]}))


def main(argv: list[str]) -> None:
    """Evaluates on BFCL, tools shown as the SEAL release shows them."""
    del argv
    evaluate_split("bfcl", prompt_style="release")


if __name__ == "__main__":
    define_flags()
    app.run(main, flags_parser=parse_flags)
