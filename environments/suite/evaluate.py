"""Evaluates a scripted policy on the suite with the plain interface and official semantics.

    python -m environments.suite.evaluate --policy=oracle --split=eval --workdir=workdirs/suite

The same command as `environments.bfcl.evaluate` (same flags, metrics.json and
transcripts.jsonl, user errors as one `error:` line), on the generated suite.
"""

from absl import app

from environments.bfcl.evaluate import define_flags, evaluate_split, parse_flags


def main(argv: list[str]) -> None:
    """Evaluates on the generated suite."""
    del argv
    evaluate_split("suite")


if __name__ == "__main__":
    define_flags()
    app.run(main, flags_parser=parse_flags)
