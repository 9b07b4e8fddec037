"""Scores assistant messages produced elsewhere (e.g. by a vLLM server) with the same verifier.

    python -m environments.bfcl.score_jsonl --input=responses.jsonl --workdir=workdirs/scored

Each input line is {"id": "multi_turn_base_0", "assistant_turns": [[msg, ...], ...]}, where
turn i lists the raw assistant messages of user turn i; BFCL result files, whose lines use
"result" for the same nesting, are accepted as they are. Writes metrics.json and
transcripts.jsonl like the evaluation command.
"""

import json
from pathlib import Path

from absl import app, flags, logging
from tqdm import tqdm

from environments.bfcl import score
from environments.bfcl.evaluate import write_report
from environments.episode import EpisodeResult


def read_responses(path: str | Path) -> list[tuple[str, list[list[str]]]]:
    """Reads (task id, assistant turns) pairs; raises ValueError naming the first bad line."""
    pairs = []
    for number, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            turns = record.get("assistant_turns", record.get("result"))
            valid = isinstance(turns, list) and all(
                isinstance(t, list) and all(isinstance(m, str) for m in t) for t in turns
            )
            if not valid:
                raise ValueError("need 'assistant_turns': a list of lists of strings")
            pairs.append((record["id"], turns))
        except (ValueError, KeyError, AttributeError) as error:
            raise ValueError(f"{path}:{number}: {error}") from error
    return pairs


def score_file(path: str | Path) -> list[EpisodeResult]:
    """Scores every line of a responses file with official semantics."""
    return [score(task_id, turns) for task_id, turns in tqdm(read_responses(path), unit="task")]


def main(argv: list[str]) -> None:
    """Scores the file given by --input and writes the report to --workdir."""
    del argv
    config = flags.FLAGS
    results = score_file(config.input)
    metrics = write_report(config.workdir, results, {"input": str(config.input)})
    logging.info("accuracy %s mean %.4f", metrics["accuracy"], metrics["mean_accuracy"])
    print(json.dumps({"accuracy": metrics["accuracy"], "mean": metrics["mean_accuracy"]}))


if __name__ == "__main__":
    flags.DEFINE_string("input", None, "JSONL file of assistant messages.", required=True)
    flags.DEFINE_string(
        "workdir", None, "Where metrics.json and transcripts.jsonl go.", required=True
    )
    app.run(main)
