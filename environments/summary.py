"""One evaluation summary, shared by the evaluation commands and the trainer's evaluation.

`summarize(results, categories)` groups episode verdicts by `EpisodeResult.category` (never by
the shape of a task id, so any task source works) and returns accuracy per category, their mean,
the same with BFCL's irrelevance check (`strict_*`), and tag and cause counts. `by_protocol`
joins the summaries of one evaluation under several protocols (environments.episode.PROTOCOLS)
into one record. `write_report` writes a summary as metrics.json next to transcripts.jsonl (one
line per episode).
"""

from __future__ import annotations

import collections
import json
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from environments.episode import EpisodeResult


def _mean(values: dict[str, float]) -> float:
    """Mean over categories (0.0 for none); the trainer logs exactly this number."""
    return float(np.mean(list(values.values()))) if values else 0.0


def summarize(results: Sequence[EpisodeResult], categories: Sequence[str] = ()) -> dict:
    """Accuracy per category, their mean, strict accuracy and tag and cause histograms.

    Args:
      results: episode verdicts; each is grouped under its `category`.
      categories: report order: these categories come first (those present), then any other
        category in order of first appearance in `results`.
    Returns:
      {"num_tasks": int,
       "accuracy": {category: fraction of successes},
       "mean": mean of "accuracy" over categories (0.0 when empty),
       "strict_accuracy": {category: fraction of strict successes (BFCL's irrelevance check,
         see EpisodeResult.strict_success)},
       "strict_mean": mean of "strict_accuracy",
       "tags": {tag: count over every turn of every result}, in order of first appearance,
       "tag_histogram": {category: {tag: count}} (tags sorted),
       "cause_histogram": {category: {cause: count}} (causes sorted)}.
    """
    by_category: dict[str, list[EpisodeResult]] = collections.defaultdict(list)
    for result in results:
        by_category[result.category].append(result)
    order = [c for c in dict.fromkeys(categories) if c in by_category]
    order += [c for c in by_category if c not in order]
    accuracy, strict, tag_histogram, cause_histogram = {}, {}, {}, {}
    for category in order:
        group = by_category[category]
        accuracy[category] = float(np.mean([bool(r.success) for r in group]))
        strict[category] = float(np.mean([r.strict_success for r in group]))
        tags = collections.Counter(tag for r in group for tag in r.turn_tags)
        causes = collections.Counter(c for r in group for turn in r.turn_causes for c in turn)
        tag_histogram[category] = dict(sorted(tags.items()))
        cause_histogram[category] = dict(sorted(causes.items()))
    return {
        "num_tasks": len(results),
        "accuracy": accuracy,
        "mean": _mean(accuracy),
        "strict_accuracy": strict,
        "strict_mean": _mean(strict),
        "tags": dict(collections.Counter(tag for r in results for tag in r.turn_tags)),
        "tag_histogram": tag_histogram,
        "cause_histogram": cause_histogram,
    }


def by_protocol(summaries: Mapping[str, dict]) -> dict:
    """One evaluation record from `summarize` results keyed by protocol, in order.

    Returns:
      {"protocol": the first protocol, **its summary (the numbers logged as eval/mean and used
       to pick the best checkpoint), "protocols": {protocol: summary} for every protocol}.
    """
    if not summaries:
        raise ValueError("no protocol summaries to join")
    primary = next(iter(summaries))
    return {"protocol": primary, **summaries[primary], "protocols": dict(summaries)}


def transcript_record(result: EpisodeResult) -> dict:
    """One line of transcripts.jsonl: the verdict, its diagnosis and every message."""
    return {
        "id": result.task_id,
        "category": result.category,
        "success": result.success,
        "strict_success": result.strict_success,
        "turn_tags": result.turn_tags,
        "turn_causes": [sorted(causes) for causes in result.turn_causes],
        "turn_error_kinds": result.turn_error_kinds,
        "failure_reason": result.failure_reason,
        "transcript": result.transcript,
    }


def write_report(
    workdir: str | Path,
    results: Sequence[EpisodeResult],
    extra: dict,
    categories: Sequence[str] = (),
) -> dict:
    """Writes metrics.json ({**extra, **summarize(results, categories)}) and transcripts.jsonl
    (one `transcript_record` per result, in order) into workdir; returns the metrics."""
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    metrics = {**extra, **summarize(results, categories)}
    (workdir / "metrics.json").write_text(json.dumps(metrics, indent=2))
    with (workdir / "transcripts.jsonl").open("w") as file:
        for result in results:
            file.write(json.dumps(transcript_record(result), ensure_ascii=False) + "\n")
    return metrics
