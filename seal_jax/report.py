"""The run report: PNG plots and a markdown summary, from `<workdir>/metrics.jsonl`.

`write_report(workdir)` writes, next to metrics.jsonl:

* `eval_success.png`: evaluation success per category (and their mean) over steps;
* `tag_distribution.png`: the share of each turn tag in the training rollouts, stacked;
* `tag_utilities.png`: the closed-loop tag utilities rho (and cause utilities, dashed);
* `interface.png`: active units per interface component, and the interface version (report.md
  adds a line when every component is off, so the flat plot is not mistaken for a dead loop);
* `report.md`: the evaluation before RL against the last one, per category (and the mean with
  BFCL's irrelevance check as well, see EpisodeResult.strict_success), the mean under each
  evaluation protocol (seal_jax/evaluation.py), what the change can be credited to (from the
  run's config.json: the change is RL's, not the weighting's alone), with the plots.

A plot whose data is not in the log yet (say, no evaluation line) is skipped and report.md says
why. Figures are drawn with `matplotlib.figure.Figure`, never pyplot, so no GUI backend or global
state is touched.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import Any

from matplotlib import colormaps
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from seal_jax.metrics import read_jsonl

EVAL_PLOT = "eval_success.png"
TAGS_PLOT = "tag_distribution.png"
UTILITIES_PLOT = "tag_utilities.png"
INTERFACE_PLOT = "interface.png"
REPORT = "report.md"
_RL_CREDIT = "The change above is what RL as a whole did from this run's warm start."


def load_records(workdir: str) -> list[dict]:
    """The metrics lines of a run, one per step (the last line wins when a resumed run repeats
    a step), sorted by step.

    Raises:
      FileNotFoundError: the work directory has no metrics.jsonl.
    """
    path = os.path.join(workdir, "metrics.jsonl")
    if not os.path.isfile(path):
        raise FileNotFoundError(
            f"{path}: no metrics log; run training with --workdir={workdir} first"
        )
    by_step = {record["step"]: record for record in read_jsonl(path) if "step" in record}
    return [by_step[step] for step in sorted(by_step)]


def write_report(workdir: str) -> str:
    """Writes the plots and report.md into workdir (see the module docstring); returns the path
    of report.md."""
    records = load_records(workdir)
    sections = [
        ("Evaluation success", _plot_eval(records, workdir)),
        ("Turn tags in training rollouts", _plot_tags(records, workdir)),
        ("Tag utilities", _plot_utilities(records, workdir)),
        ("Learning interface", _plot_interface(records, workdir)),
    ]
    lines = ["# Run report", "", f"Work directory: `{os.path.abspath(workdir)}`", ""]
    lines += _summary(records)
    lines += _credit(workdir)
    for title, (image, note) in sections:
        lines += [f"## {title}", ""]
        lines += [f"![{title}]({image})", ""] if image else []
        lines += [f"_{note}_", ""] if note else []
    path = os.path.join(workdir, REPORT)
    with open(path, "w") as f:
        f.write("\n".join(lines))
    return path


def _eval_records(records: Sequence[dict]) -> list[dict]:
    return [r for r in records if isinstance(r.get("eval"), dict) and "accuracy" in r["eval"]]


def _train_records(records: Sequence[dict]) -> list[dict]:
    return [r for r in records if isinstance(r.get("rollout"), dict)]


def _keys_in_order(dicts: Sequence[dict]) -> list[str]:
    """Every key of the dicts, in order of first appearance."""
    return list(dict.fromkeys(key for d in dicts for key in d))


def _points(value: float) -> str:
    return f"{100 * value:.1f}"


def _summary(records: Sequence[dict]) -> list[str]:
    """Markdown lines: before-RL vs final evaluation per category, steps and wall time."""
    evals, train = _eval_records(records), _train_records(records)
    steps = max((r["step"] for r in train), default=0)
    step_s = sum(r["time"].get("step_s", 0.0) for r in train if isinstance(r.get("time"), dict))
    eval_s = sum(r["eval"].get("seconds", 0.0) for r in evals)
    lines = [
        f"Training steps: {steps}. Wall time: {_duration(step_s + eval_s)} "
        f"(training {_duration(step_s)}, evaluation {_duration(eval_s)}).",
        "",
    ]
    if not evals:
        return lines + ["_No evaluation in the log yet: no final numbers._", ""]
    first, last = evals[0], evals[-1]
    categories = _keys_in_order([first["eval"]["accuracy"], last["eval"]["accuracy"]])
    protocol = last["eval"].get("protocol")
    under = f" under the `{protocol}` protocol" if protocol else ""
    lines += [
        f"Success (%) at step {first['step']} (before RL) and step {last['step']} (final){under}:",
        "",
        f"| category | step {first['step']} | step {last['step']} | change (points) |",
        "| --- | --- | --- | --- |",
    ]
    rows = [
        (c, first["eval"]["accuracy"].get(c), last["eval"]["accuracy"].get(c)) for c in categories
    ]
    rows.append(("**mean**", first["eval"].get("mean"), last["eval"].get("mean")))
    lines += [_change_row(*row) for row in rows]
    lines += _protocol_lines(first, last)
    if None not in (first["eval"].get("strict_mean"), last["eval"].get("strict_mean")):
        lines += [
            "",
            f"With BFCL's irrelevance check as well (no call on a turn whose ground truth makes "
            f"none; bfcl_eval ships it, its runner does not apply it): mean "
            f"{_points(first['eval']['strict_mean'])} -> {_points(last['eval']['strict_mean'])}.",
        ]
    if first is last:
        lines += ["", "_Only one evaluation so far: no improvement to report yet._"]
    return lines + [""]


def _credit(workdir: str) -> list[str]:
    """Markdown lines: the run's loss (from config.json, which run.py writes beside the log) and
    what its change can be credited to; none without a config.json."""
    path = os.path.join(workdir, "config.json")
    if not os.path.isfile(path):
        return []
    with open(path) as f:
        config = json.load(f)
    weighting = config.get("weighting", {})
    if not weighting.get("enabled", False):
        return [f"Loss: GRPO without diagnosis weights (vanilla). {_RL_CREDIT}", ""]
    utilities = "closed-loop" if weighting.get("closed_loop", False) else "fixed"
    line = (
        f"Loss: diagnosis-weighted GRPO (SEAL, {utilities} tag utilities). {_RL_CREDIT} "
        "Measuring what the weighting adds needs vanilla GRPO from the same warm start over "
        "paired seeds (`python -m benchmarks.seal_vs_baselines --arms=seal,vanilla_grpo`)."
    )
    if config.get("env", {}).get("name") == "suite":
        line += (
            " On this generated suite ten paired seeds did not separate the two "
            '(benchmarks/README.md, "The result: seeds 0-9").'
        )
    return [line, ""]


def _change_row(name: str, before: float | None, after: float | None) -> str:
    """A markdown row: name, both values in %, and the change in points."""
    change = f"{100 * (after - before):+.1f}" if None not in (before, after) else "n/a"
    cells = [_points(v) if v is not None else "n/a" for v in (before, after)]
    return f"| {name} | {cells[0]} | {cells[1]} | {change} |"


def _protocol_lines(first: dict, last: dict) -> list[str]:
    """Markdown lines: the mean success under each evaluation protocol, first vs last."""
    before, after = (r["eval"].get("protocols") or {} for r in (first, last))
    names = _keys_in_order([before, after])
    if not names:
        return []
    lines = [
        "",
        "Mean success (%) per evaluation protocol (`release`: the SEAL release's validation "
        "environment, which the paper's table reports; `official`: BFCL's runner; "
        "docs/protocol.md):",
        "",
        f"| protocol | step {first['step']} | step {last['step']} | change (points) |",
        "| --- | --- | --- | --- |",
    ]
    for name in names:
        lines.append(
            _change_row(
                f"`{name}`", before.get(name, {}).get("mean"), after.get(name, {}).get("mean")
            )
        )
    return lines


def _duration(seconds: float) -> str:
    minutes, secs = divmod(int(round(seconds)), 60)
    return f"{minutes}m{secs:02d}s"


def _save(fig: Figure, workdir: str, name: str) -> tuple[str, str]:
    for ax in fig.axes:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    fig.tight_layout()
    fig.savefig(os.path.join(workdir, name), dpi=100)
    return name, ""


def _plot_eval(records: Sequence[dict], workdir: str) -> tuple[str | None, str]:
    """Evaluation success (%) per category and mean over steps."""
    evals = _eval_records(records)
    if not evals:
        return None, "No evaluation line in metrics.jsonl yet."
    steps = [r["step"] for r in evals]
    fig = Figure(figsize=(7, 4))
    ax = fig.add_subplot()
    for category in _keys_in_order([r["eval"]["accuracy"] for r in evals]):
        values = [100 * r["eval"]["accuracy"].get(category, float("nan")) for r in evals]
        ax.plot(steps, values, marker="o", label=category)
    means = [100 * r["eval"].get("mean", float("nan")) for r in evals]
    ax.plot(steps, means, marker="s", color="black", linewidth=2.5, label="mean")
    ax.set(xlabel="step", ylabel="success (%)", ylim=(-2, 102), title="Evaluation success")
    ax.legend(loc="best", fontsize="small")
    ax.grid(alpha=0.3)
    return _save(fig, workdir, EVAL_PLOT)


def _plot_tags(records: Sequence[dict], workdir: str) -> tuple[str | None, str]:
    """Stacked share of each turn tag in the training rollouts over steps."""
    train = [r for r in _train_records(records) if r["rollout"].get("tag_fraction")]
    if not train:
        return None, "No training rollout with turn tags in metrics.jsonl yet."
    fractions = [r["rollout"]["tag_fraction"] for r in train]
    tags = sorted(_keys_in_order(fractions), key=lambda t: -sum(f.get(t, 0.0) for f in fractions))
    fig = Figure(figsize=(8, 4))
    ax = fig.add_subplot()
    ax.stackplot(
        [r["step"] for r in train],
        [[f.get(tag, 0.0) for f in fractions] for tag in tags],
        labels=tags,
        colors=[_color(i) for i in range(len(tags))],
    )
    ax.set(xlabel="step", ylabel="share of turns", ylim=(0, 1), title="Turn tags")
    ax.legend(loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize="small")
    return _save(fig, workdir, TAGS_PLOT)


def _plot_utilities(records: Sequence[dict], workdir: str) -> tuple[str | None, str]:
    """Tag utilities (solid) and cause utilities (dashed) over steps."""
    train = [r for r in records if isinstance(r.get("utilities"), dict) and r["utilities"]]
    if not train:
        return None, "No tag utilities in metrics.jsonl yet."
    steps = [r["step"] for r in train]
    fig = Figure(figsize=(8, 4))
    ax = fig.add_subplot()
    for i, name in enumerate(_keys_in_order([r["utilities"] for r in train])):
        values = [r["utilities"].get(name, float("nan")) for r in train]
        kind, _, label = name.partition("/")
        style = "--" if kind.startswith("cause") else "-"
        ax.plot(steps, values, style, color=_color(i), label=label or name)
    ax.set(xlabel="step", ylabel="utility", title="Tag utilities (dashed: causes)")
    ax.legend(loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize="small")
    ax.grid(alpha=0.3)
    return _save(fig, workdir, UTILITIES_PLOT)


def _plot_interface(records: Sequence[dict], workdir: str) -> tuple[str | None, str]:
    """Active units per interface component (top) and the interface version (bottom)."""
    train = [r for r in records if isinstance(r.get("interface"), dict)]
    if not train:
        return None, "No interface state in metrics.jsonl yet."
    steps = [r["step"] for r in train]
    counts = [_active_counts(r["interface"]) for r in train]
    components = [c for c in _keys_in_order(counts) if c != "version"]
    fig = Figure(figsize=(8, 5))
    top, bottom = fig.subplots(2, 1, sharex=True, height_ratios=(2, 1))
    for i, component in enumerate(components):
        values = [c.get(component, float("nan")) for c in counts]
        top.step(steps, values, where="post", color=_color(i), label=component)
    modes = train[-1]["interface"].get("modes") or {}
    subtitle = ", ".join(f"{k}={v}" for k, v in modes.items())
    top.set(ylabel="active units", title=f"Learning interface\n{subtitle}")
    top.title.set_fontsize("small")
    top.legend(loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize="small")
    top.grid(alpha=0.3)
    versions = [
        r["interface"].get("version", c.get("version", float("nan"))) for r, c in zip(train, counts)
    ]
    bottom.step(steps, versions, where="post", color="black")
    bottom.set(xlabel="step", ylabel="version")
    bottom.grid(alpha=0.3)
    all_off = bool(modes) and set(modes.values()) == {"off"}
    note = "Every interface component is off in this run: no unit can switch on." if all_off else ""
    return _save(fig, workdir, INTERFACE_PLOT)[0], note


def _active_counts(interface: dict) -> dict[str, float]:
    """{component: active units} from the "interface/<component>" scalars, else from `active`."""
    counts = {k.split("/", 1)[1]: v for k, v in interface.items() if k.startswith("interface/")}
    if counts:
        return counts
    return {c: len(units) for c, units in (interface.get("active") or {}).items()}


def _color(index: int) -> Any:
    """A distinct colour per series: tab10's ten, then tab20's lighter shades."""
    if index < 10:
        return colormaps["tab10"](index)
    return colormaps["tab20"]((2 * index + 1) % 20)
