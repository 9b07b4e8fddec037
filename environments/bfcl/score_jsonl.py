"""Scores assistant messages produced elsewhere (e.g. by a vLLM server) with the same verifier.

    python -m environments.bfcl.score_jsonl --input=responses.jsonl --workdir=workdirs/scored

Each input line is {"id": "multi_turn_base_0", "assistant_turns": [[msg, ...], ...]}, where
turn i lists the raw assistant messages of user turn i; BFCL result files, whose lines use
"result" for the same nesting, are accepted as they are. Writes metrics.json and
transcripts.jsonl like the evaluation command.

Nothing is dropped silently: a line that cannot be scored as it stands (not JSON, wrong shape,
more turns than its task has, a repeated id) counts as a failed episode of its task when its id
names a task (the first line of a repeated id is the one scored), and is skipped when it names
none. Every such line is logged with its number and listed in metrics.json
(`num_malformed_lines`, `malformed_lines`: {"line", "id", "error", "outcome"}).
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable
from pathlib import Path

from absl import app, flags, logging
from tqdm import tqdm

from environments.bfcl import load_task, score_task
from environments.bfcl.evaluate import fail, parse_flags, prepare_workdir
from environments.episode import EpisodeResult
from environments.summary import write_report
from environments.task import ToolTask

# The id of a line that is not valid JSON (e.g. cut short), when it can still be read.
_ID_PATTERN = re.compile(r'"id"\s*:\s*"([^"\\]+)"')


def _turns(record: dict) -> list[list[str]]:
    """The assistant turns of a parsed line; raises ValueError when they have the wrong shape."""
    turns = record.get("assistant_turns", record.get("result"))
    valid = isinstance(turns, list) and all(
        isinstance(t, list) and all(isinstance(m, str) for m in t) for t in turns
    )
    if not valid:
        raise ValueError("need 'assistant_turns' (or 'result'): a list of lists of strings")
    return turns


def failed_result(task: ToolTask, reason: str) -> EpisodeResult:
    """A failed episode of `task` that was never played (no turn tags), failing for `reason`."""
    return EpisodeResult(task.task_id, task.category, False, [], [], [], reason)


def score_lines(
    lines: list[str], load: Callable[[str], ToolTask] = load_task, progress: bool = False
) -> tuple[list[EpisodeResult], list[dict]]:
    """Scores JSONL lines with official semantics; loses no line.

    Args:
      lines: the file's lines (blank ones are ignored).
      load: task id -> ToolTask; raises ValueError for an id it does not know.
      progress: show a progress bar.
    Returns:
      (results, malformed): one EpisodeResult per task named by a line, in order of first
      appearance (a failed one, with `failure_reason` naming the line and the problem, where
      the line could not be scored), and one {"line": number, "id": id or None, "error": why,
      "outcome": "failure" | "skipped"} per line that could not be scored as it stands.
    """
    results: list[EpisodeResult] = []
    malformed: list[dict] = []
    first_line: dict[str, int] = {}
    for number, line in enumerate(tqdm(lines, unit="line", disable=not progress), 1):
        if not line.strip():
            continue
        task_id, task, error = None, None, None
        try:
            record = json.loads(line)
        except ValueError as e:
            record, error = None, f"not JSON: {e}"
            match = _ID_PATTERN.search(line)
            task_id = match.group(1) if match else None
        if record is not None:
            if not isinstance(record, dict):
                error = f"need a JSON object, got {type(record).__name__}"
            elif not isinstance(record.get("id"), str):
                error = "need 'id': a task id string"
            else:
                task_id = record["id"]
        if task_id is not None:
            try:
                task = load(task_id)
            except ValueError as e:
                error = str(e) if error is None else error
                task_id = task_id if record is not None else None
        if task is not None and task_id in first_line:
            error = f"repeats the id of line {first_line[task_id]} (that line is the one scored)"
            task = None
        outcome = "skipped"
        if task is not None:
            first_line[task_id] = number
            result = None
            if error is None:
                try:
                    result = score_task(task, _turns(record))
                except Exception as e:  # noqa: BLE001  (reported per line; the rest is scored)
                    error = str(e) if isinstance(e, ValueError) else f"{type(e).__name__}: {e}"
            if result is None:
                result, outcome = (
                    failed_result(task, f"malformed line {number}: {error}"),
                    "failure",
                )
            results.append(result)
        if error is not None:
            malformed.append({"line": number, "id": task_id, "error": error, "outcome": outcome})
    return results, malformed


def read_lines(path: str | Path) -> list[str]:
    """The lines of a responses file; OSError if it cannot be read."""
    return Path(path).expanduser().read_text(encoding="utf-8", errors="replace").splitlines()


def score_file(path: str | Path, progress: bool = False) -> tuple[list[EpisodeResult], list[dict]]:
    """Scores every line of a responses file (see `score_lines`); OSError if it is unreadable."""
    return score_lines(read_lines(path), progress=progress)


def main(argv: list[str]) -> None:
    """Scores the file given by --input and writes the report to --workdir."""
    del argv
    config = flags.FLAGS
    try:
        lines = read_lines(config.input)
    except OSError as e:
        fail(f"cannot read --input={config.input}: {e.strerror or e}")
    workdir = prepare_workdir(config.workdir)
    results, malformed = score_lines(lines, progress=True)
    for entry in malformed:
        logging.warning(
            "%s:%d (%s): %s; %s",
            config.input,
            entry["line"],
            entry["id"] or "no task id",
            entry["error"],
            "counted as a failure" if entry["outcome"] == "failure" else "skipped",
        )
    extra = {"input": str(config.input), "num_malformed_lines": len(malformed)}
    metrics = write_report(workdir, results, {**extra, "malformed_lines": malformed})
    logging.info("accuracy %s mean %.4f", metrics["accuracy"], metrics["mean"])
    summary = {"accuracy": metrics["accuracy"], "mean": metrics["mean"]}
    print(json.dumps({**summary, "num_malformed_lines": len(malformed)}))
    if malformed:
        print(
            f"{len(malformed)} malformed line(s) in {config.input}: see malformed_lines in "
            f"{workdir / 'metrics.json'}",
            file=sys.stderr,
        )


if __name__ == "__main__":
    flags.DEFINE_string("input", None, "JSONL file of assistant messages.", required=True)
    flags.DEFINE_string(
        "workdir", None, "Where metrics.json and transcripts.jsonl go.", required=True
    )
    app.run(main, flags_parser=parse_flags)
