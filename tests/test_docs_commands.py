"""Every shell command the documentation shows runs as written from the repository root.

The commands are read from the ```bash (also sh, shell, or untagged) code blocks of DOCS: `\\`
continuations and lines continued inside quotes are joined, comment lines and trailing `#`
comments dropped. Each command is either run, with the budget flags of its module in RUN
appended (its output paths moved into a temporary directory) and its exit code and promised
outputs checked, or named in SKIP with the reason. A command that is neither fails, so a command
added to the docs later is tested by default: give its module a budget in RUN, or a reason in
SKIP. The commands run two at a time in the background from the first test of them on; each
test waits for its own.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import re
import shlex
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.devices import REPO, cpu_env

DOCS = (
    "README.md",
    "BUILD.md",
    "environments/README.md",
    "environments/suite/README.md",
    "benchmarks/README.md",
)
SHELL_BLOCKS = ("bash", "sh", "shell", "")
PYTHONS = ("python", "python3", ".venv/bin/python")


@dataclasses.dataclass(frozen=True)
class Command:
    doc: str
    line: int
    text: str  # shell words joined by single spaces, comments removed
    words: tuple[str, ...]

    @property
    def id(self) -> str:
        return f"{self.doc}:{self.line}"

    @property
    def program(self) -> str:
        """`python -m X` -> X, `python X.py` -> X.py, else the first word."""
        words = [w for w in self.words if not re.fullmatch(r"\w+=\S*", w)]  # VAR=value prefixes
        if words and words[0] in PYTHONS and len(words) > 1:
            return words[2] if words[1] == "-m" and len(words) > 2 else words[1]
        return words[0] if words else ""


def doc_commands(doc: str) -> list[Command]:
    """The shell commands of one document's shell code blocks, in order."""
    commands, block, pending, start = [], None, "", 0
    for number, line in enumerate((Path(REPO) / doc).read_text().splitlines(), 1):
        fence = re.match(r"^\s*```(\S*)", line)
        if fence:
            block = None if block is not None else fence.group(1).lower()
            pending = ""
            continue
        if block not in SHELL_BLOCKS:
            continue
        if not pending:
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            start = number
        pending += line
        if pending.endswith("\\"):
            pending = pending[:-1] + " "
            continue
        try:
            words = shlex.split(pending, comments=True)
        except ValueError:  # an open quote: the command goes on on the next line
            pending += "\n"
            continue
        commands.append(Command(doc, start, " ".join(words), tuple(words)))
        pending = ""
    return commands


COMMANDS = [c for doc in DOCS for c in doc_commands(doc)]

# Commands not run, by a regular expression searched in the command's text, with the reason.
SKIP = {
    r"^make (install-test )?(smollm2|demo-real)$": "imports SmolLM2-135M-Instruct from its "
    "wheel's GGUF into workdirs/models (tests/test_smollm2.py imports the same file) and, for "
    "demo-real, trains it (README states its measured time)",
    r"^python -m benchmarks\.bench_generate --checkpoint=workdirs/models/": "the real model at "
    "real lengths (about 25 minutes on 2 cores); the small-model command runs here and "
    "tests/test_smollm2.py checks the engine's greedy tokens on that model against transformers",
    r"^make (demo|test)$": "what CI runs (make test: lint and the whole suite; make demo: the "
    "10-minute CPU default job)",
    r"^python run\.py --config=configs/qwen\.py(?!.*--mode=compile$)": "needs a Qwen2.5-7B "
    "checkpoint (--config.model.path) and an accelerator",
    r"^(python3 -m venv|pip install)": "installs packages from the network into a new "
    "environment (the README's install, which this test runs after)",
    r"^gcloud ": "needs a TPU VM and Google Cloud credentials",
    r"--mode=compile$": "compiles a 7B model for a TPU topology: needs libtpu (0.7 GB, not in "
    "the test install) and about 1.5 minutes; tests/test_compile_mode.py runs --mode=compile "
    "for simulated CPU devices",
    r"^python -m benchmarks\.compile_targets( --targets=\S+)?$": "compiles TPU targets: needs "
    "libtpu (not in the test install) and 1-10 minutes per target; tests/test_compile_tables.py "
    "checks the docs' tables against the JSON it writes",
    r"^python -m benchmarks\.compile_targets --render$": "rewrites the docs' tables in place; "
    "tests/test_compile_tables.py checks that they equal what it renders",
    r"^python -m benchmarks\.bench_continuous( |$)": "compiles two schedules' programs (about "
    "a minute on 2 cores at the smallest budget, 40 for the Qwen2.5-0.5B rows); "
    "tests/test_continuous.py checks that the schedules give the same episodes",
    r"benchmarks\.decode_roofline": "compiles Qwen2.5-7B decode steps for TPU topologies: needs "
    "libtpu (not in the test install) and about a minute per target",
    r"benchmarks\.decode_memory_qwen35": "compiles the decode programs of three 3-7B models at "
    "three history lengths for a TPU chip: needs libtpu (not in the test install) and several "
    "minutes of compiles; tests/test_compile_mode.py checks its analytic per-row figures",
    r"^python -m benchmarks\.bench_compile_cache$": "runs configs/tiny.py's run.py job twice "
    "(over 2 minutes on 2 cores even at the smallest budget); run.py training is run here by "
    "the seal_vs_baselines smoke command",
    r"^python -m benchmarks\.seal_vs_baselines (?!.*--report_only)(.*--out_dir=workdirs/"
    r"(svb|svb_ent|closed_loop_remeasure|seal_vs_baselines_(official|full|16|reduced|study))$)": (
        "a full comparison "
        "(hours; the 10-seed study about 6 hours on 2 cores; --warm_starts_from and --reuse read "
        "an earlier comparison's runs): the same script as the smoke command, which runs here"
    ),
    r"^python -m benchmarks\.closed_loop_diagnosis ": "reads a finished closed-loop run and its "
    "plain twin (the study's; none here) and probes their warm start on 200 tasks under 7 "
    "views (about 10 minutes on 2 cores); tests/test_closed_loop_diagnosis.py checks its "
    "trajectory on synthetic runs and its tokenizer figure",
    r"^python -m benchmarks\.seal_vs_baselines --report_only": "reports the study's finished "
    "runs (none here) or its committed record, whose flags the smoke budget would contradict; "
    "tests/test_seal_vs_baselines_stats.py reports synthetic runs and the committed record",
}


@dataclasses.dataclass(frozen=True)
class Budget:
    """How a command runs here: flags appended (the last of a repeated flag wins), path flags
    whose value moves into tmp_path (added when the command has none), files it must write
    (relative to those paths, as "{flag}/file"), and an optional setup and check."""

    flags: tuple[str, ...] = ()
    paths: tuple[str, ...] = ()
    outputs: tuple[str, ...] = ()
    setup: Callable[[dict[str, Path]], None] | None = None
    check: Callable[[dict[str, Path], str], None] | None = None


def _responses(paths: dict[str, Path]) -> None:
    from environments.bfcl import load_task
    from environments.policies import oracle_turns

    ids = ["multi_turn_base_0", "multi_turn_miss_func_0"]
    lines = [json.dumps({"id": i, "assistant_turns": oracle_turns(load_task(i))}) for i in ids]
    paths["--input"].write_text("\n".join(lines) + "\n")


def _scored(paths: dict[str, Path], stdout: str) -> None:
    metrics = json.loads((paths["--workdir"] / "metrics.json").read_text())
    assert metrics["mean"] == 1.0 and metrics["num_malformed_lines"] == 0, metrics


def _evaluated(paths: dict[str, Path], stdout: str) -> None:
    metrics = json.loads((paths["--workdir"] / "metrics.json").read_text())
    assert metrics["num_tasks"] == 2 and metrics["mean"] in (0.0, 1.0), metrics


def _tfds_readable(paths: dict[str, Path], stdout: str) -> None:
    import tensorflow_datasets as tfds

    from environments.bfcl import tfds_builder

    source = tfds.data_source("bfcl_multi_turn", split="eval", data_dir=str(paths["--data_dir"]))
    assert len(source) == 400 and tfds_builder.decode(source[0]).task_id


def _accelerator_lines(paths: dict[str, Path], stdout: str) -> None:
    """Every figure's line is printed, and the tiny model matches transformers."""
    for start in ("device:", "parity float32", "parity bf16", "greedy", "train tiny", "decode"):
        assert any(line.startswith(start) for line in stdout.splitlines()), (start, stdout)
    assert "update_micro_step" in stdout and "rollout_decode" in stdout, stdout
    assert re.search(r"^greedy .*: (\d+)/\1 rows identical", stdout, re.M), stdout
    assert re.search(r"^parity float32 .*argmax agrees 100\.00%", stdout, re.M), stdout


EVALUATE = Budget(
    flags=("--limit=2", "--num_workers=1"),
    paths=("--workdir",),
    outputs=("--workdir/metrics.json", "--workdir/transcripts.jsonl"),
    check=_evaluated,
)
RUN = {
    "environments.bfcl.tfds_builder": Budget(
        paths=("--data_dir",),
        outputs=("--data_dir/bfcl_multi_turn/release/1.1.0/dataset_info.json",),
        check=_tfds_readable,
    ),
    "environments.bfcl.evaluate": EVALUATE,
    "environments.suite.evaluate": EVALUATE,
    "environments.bfcl.score_jsonl": Budget(
        paths=("--input", "--workdir"),
        outputs=("--workdir/metrics.json", "--workdir/transcripts.jsonl"),
        setup=_responses,
        check=_scored,
    ),
    "benchmarks.bench_generate": Budget(
        ("--models=small", "--batches=1", "--prompt_len=4", "--new_tokens=2")
    ),
    "benchmarks.bench_multiturn": Budget(
        ("--shape=tiny", "--histories=8", "--env_tokens=2", "--reply_tokens=2")
        + ("--context_limit=64",)
    ),
    "benchmarks.bench_rollout_batch": Budget(
        ("--rows=8", "--caches=64", "--prompt_len=8", "--new_tokens=2")
    ),
    "benchmarks.bench_shared_prompt": Budget(
        ("--shape=tiny", "--groups=1", "--group_size=2", "--prompt_len=8", "--response_len=4")
        + ("--repeats=1",)
    ),
    "benchmarks.bench_train_pass": Budget(("--lengths=64", "--batch=1", "--repeats=1")),
    "benchmarks.bench_checkpoint": Budget(("--shape=tiny", "--steps=2", "--step_s=0")),
    "benchmarks.bench_accelerator": Budget(("--tiny",), check=_accelerator_lines),
    "benchmarks.seal_vs_baselines": Budget(
        ("--seeds=1", "--arms=seal", "--sft_steps=1", "--max_steps=1", "--eval_every=1")
        + ("--eval_limit=4", "--batch_tasks=2", "--group_size=2", "--mini_batch_tasks=1")
        + ("--override=--config.rollout.max_new_tokens=16",)
        + ("--override=--config.train.eval_max_new_tokens=16",),
        paths=("--out_dir",),
        outputs=("--out_dir/results.md", "--out_dir/results.json", "--out_dir/comparison.png"),
    ),
}


def skip_reason(command: Command) -> str | None:
    reasons = [reason for pattern, reason in SKIP.items() if re.search(pattern, command.text)]
    assert len(reasons) <= 1, f"{command.id}: several SKIP entries match {command.text!r}"
    return reasons[0] if reasons else None


RUNNABLE = [c for c in COMMANDS if skip_reason(c) is None]


def test_every_doc_command_is_run_or_skipped_with_a_reason():
    programs = {c.program for c in COMMANDS}
    assert {"run.py", "environments.bfcl.evaluate", "benchmarks.seal_vs_baselines"} <= programs
    for pattern in SKIP:
        assert any(re.search(pattern, c.text) for c in COMMANDS), f"stale SKIP entry {pattern!r}"
    for command in RUNNABLE:
        assert command.program in RUN, (
            f"{command.id}: `{command.text}` is neither run nor skipped: add its module "
            f"{command.program!r} to RUN (a tiny budget) or the command to SKIP (with the reason)"
        )


def run_command(command: Command, tmp_path: Path) -> tuple[dict[str, Path], list[str], Any]:
    """Runs a command of the docs with its module's budget: (paths, args, finished process)."""
    budget = RUN[command.program]
    # As written (no PYTHONPATH), on one CPU device, compiling as the tests' run.py processes do.
    env = {k: v for k, v in cpu_env().items() if k != "PYTHONPATH"}
    words = list(command.words)
    while re.fullmatch(r"\w+=\S*", words[0]):  # VAR=value prefixes
        name, _, value = words.pop(0).partition("=")
        env[name] = value
    assert words[0] in PYTHONS, command.text
    paths = {flag: tmp_path / flag.lstrip("-") for flag in budget.paths}
    args = []
    for word in words[1:]:
        flag = word.split("=", 1)[0]
        args.append(f"{flag}={paths[flag]}" if flag in paths and "=" in word else word)
    args += list(budget.flags) + [f"{flag}={path}" for flag, path in paths.items()]
    if budget.setup:
        budget.setup(paths)
    proc = subprocess.run(
        [sys.executable, *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=600
    )
    return paths, args, proc


@pytest.fixture(scope="module")
def started(request, tmp_path_factory):
    """{command id: future of `run_command`} for the selected commands, all started when the
    first of them is tested, two at a time (each process keeps about one core busy)."""
    commands = [
        item.callspec.params["command"]
        for item in request.session.items
        if getattr(item, "module", None) is request.module and hasattr(item, "callspec")
    ]
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=2)
    futures = {c.id: pool.submit(run_command, c, tmp_path_factory.mktemp("doc")) for c in commands}
    yield futures
    pool.shutdown(wait=True, cancel_futures=True)


@pytest.mark.parametrize("command", RUNNABLE, ids=[c.id for c in RUNNABLE])
def test_doc_command_runs(command, started):
    paths, args, proc = started[command.id].result()
    assert proc.returncode == 0, f"{' '.join(args)}\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    budget = RUN[command.program]
    for output in budget.outputs:
        flag, _, rest = output.partition("/")
        assert (paths[flag] / rest).is_file(), f"{command.id}: no {output}"
    if budget.check:
        budget.check(paths, proc.stdout)
