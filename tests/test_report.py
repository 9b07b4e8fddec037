"""The run report: plots and final numbers from a synthetic metrics.jsonl."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from matplotlib.image import imread

from seal_jax import report

CATEGORIES = ("base", "miss_func", "miss_param", "long_context")


def _eval(step: int, accuracy: list[float], seconds: float, strict_mean: float = 0.0) -> dict:
    acc = dict(zip(CATEGORIES, accuracy))
    return {
        "accuracy": acc,
        "mean": sum(accuracy) / 4,
        "strict_mean": strict_mean,
        "num_tasks": 200,
        "seconds": seconds,
    }


def _train(step: int) -> dict:
    """A training line shaped like the trainer's."""
    return {
        "step": step,
        "time": {"step_s": 30.0, "generate_s": 20.0},
        "rollout": {
            "reward_mean": 0.1 * step,
            "tag_fraction": {"pass": 0.2 * step, "state_mismatch": 1 - 0.2 * step},
        },
        "utilities": {"utility/pass": 1.0, "utility/state_mismatch": 1.0 + 0.05 * step},
        "interface": {
            "modes": {"schema_cues": "adaptive", "error_hints": "adaptive"},
            "version": step // 2,
            "active": {"schema_cues": ["send"] * step, "error_hints": []},
            "interface/version": float(step // 2),
            "interface/schema_cues": float(step),
            "interface/error_hints": 0.0,
        },
        "loss": {"loss": 0.01},
    }


def _write(workdir, records: list[dict]) -> None:
    with open(workdir / "metrics.jsonl", "w") as f:
        for record in records:
            f.write(json.dumps({"time": 1.0, **record}) + "\n")


PLOTS = (report.EVAL_PLOT, report.TAGS_PLOT, report.UTILITIES_PLOT, report.INTERFACE_PLOT)


def test_report_writes_every_plot_and_the_final_numbers(tmp_path):
    records = [{"step": 0, "eval": _eval(0, [0.10, 0.0, 0.20, 0.30], 12.0)}]
    records += [_train(s) for s in (1, 2, 3)]
    records[-1]["eval"] = _eval(3, [0.50, 0.0, 0.30, 0.26], 14.0, strict_mean=0.125)
    _write(tmp_path, records)

    path = report.write_report(str(tmp_path))

    for name in PLOTS:
        image = imread(tmp_path / name)
        assert image.shape[0] > 100 and image.shape[1] > 100
        assert image[..., :3].std() > 0  # something was drawn
    text = Path(path).read_text()
    assert "| base | 10.0 | 50.0 | +40.0 |" in text
    assert "| miss_func | 0.0 | 0.0 | +0.0 |" in text
    assert "| long_context | 30.0 | 26.0 | -4.0 |" in text
    assert "| **mean** | 15.0 | 26.5 | +11.5 |" in text
    assert "irrelevance check as well" in text and "mean 0.0 -> 12.5." in text
    assert "Training steps: 3." in text
    assert "Wall time: 1m56s (training 1m30s, evaluation 0m26s)" in text
    for name in PLOTS:
        assert f"]({name})" in text
    assert "interface component is off" not in text


def test_report_says_when_every_interface_component_is_off(tmp_path):
    records = [_train(s) for s in (1, 2)]
    for record in records:
        record["interface"]["modes"] = {"schema_cues": "off", "error_hints": "off"}
    _write(tmp_path, records)

    text = Path(report.write_report(str(tmp_path))).read_text()

    assert f"]({report.INTERFACE_PLOT})" in text
    assert "Every interface component is off in this run" in text


def test_report_without_evaluation_says_so(tmp_path):
    _write(tmp_path, [_train(1), _train(2)])

    text = Path(report.write_report(str(tmp_path))).read_text()

    assert "No evaluation in the log yet" in text
    assert "No evaluation line in metrics.jsonl yet." in text
    assert not (tmp_path / report.EVAL_PLOT).exists()
    assert (tmp_path / report.TAGS_PLOT).exists() and (tmp_path / report.INTERFACE_PLOT).exists()


def test_report_before_training_has_no_training_plots(tmp_path):
    _write(tmp_path, [{"step": 0, "eval": _eval(0, [0.1, 0.2, 0.3, 0.4], 5.0)}])

    text = Path(report.write_report(str(tmp_path))).read_text()

    assert "Only one evaluation so far" in text
    assert (tmp_path / report.EVAL_PLOT).exists()
    for name in (report.TAGS_PLOT, report.UTILITIES_PLOT, report.INTERFACE_PLOT):
        assert not (tmp_path / name).exists()


def test_resumed_run_keeps_the_last_line_of_a_repeated_step(tmp_path):
    stale = {"step": 2, "eval": _eval(2, [0.0] * 4, 1.0)}
    fresh = {"step": 2, "eval": _eval(2, [1.0] * 4, 1.0)}
    _write(tmp_path, [{"step": 0, "eval": _eval(0, [0.0] * 4, 1.0)}, stale, fresh])

    assert [r["eval"]["mean"] for r in report.load_records(str(tmp_path))] == [0.0, 1.0]


def test_missing_log_is_one_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="no metrics log"):
        report.write_report(str(tmp_path))


def test_report_lists_every_evaluation_protocol(tmp_path):
    """Two protocols per evaluation (seal_jax/evaluation.py): the first one's table, then the
    mean under each; numbers by hand: release 10.0 -> 40.0, official 20.0 -> 35.0."""
    records = []
    for step, (release, official) in ((0, (0.10, 0.20)), (4, (0.40, 0.35))):
        summaries = {
            name: _eval(step, [mean] * 4, 1.0)
            for name, mean in (("release", release), ("official", official))
        }
        evaluation = {"protocol": "release", **summaries["release"], "protocols": summaries}
        records.append({"step": step, "eval": evaluation})
    _write(tmp_path, records)

    text = Path(report.write_report(str(tmp_path))).read_text()

    assert "(final) under the `release` protocol:" in text
    assert "| **mean** | 10.0 | 40.0 | +30.0 |" in text
    assert "| `release` | 10.0 | 40.0 | +30.0 |" in text
    assert "| `official` | 20.0 | 35.0 | +15.0 |" in text


def test_report_of_a_run_without_protocols_has_no_protocol_table(tmp_path):
    _write(tmp_path, [{"step": 0, "eval": _eval(0, [0.1] * 4, 1.0)}])
    text = Path(report.write_report(str(tmp_path))).read_text()
    assert "per evaluation protocol" not in text and "protocol:" not in text


@pytest.mark.parametrize(
    "weighting, env, says",
    [
        ({"enabled": True, "closed_loop": True}, "suite", "SEAL, closed-loop tag utilities"),
        ({"enabled": True, "closed_loop": False}, "bfcl", "SEAL, fixed tag utilities"),
        ({"enabled": False, "closed_loop": True}, "suite", "without diagnosis weights"),
    ],
)
def test_report_credits_the_change_to_rl_not_to_the_weighting_alone(tmp_path, weighting, env, says):
    records = [{"step": 0, "eval": _eval(0, [0.1] * 4, 1.0)}, _train(1)]
    records[-1]["eval"] = _eval(1, [0.5] * 4, 1.0)
    _write(tmp_path, records)
    (tmp_path / "config.json").write_text(
        json.dumps({"weighting": weighting, "env": {"name": env}})
    )

    text = Path(report.write_report(str(tmp_path))).read_text()

    assert f"Loss: {'GRPO' if not weighting['enabled'] else 'diagnosis-weighted GRPO'}" in text
    assert says in text and "what RL as a whole did" in text
    paired = "--arms=seal,vanilla_grpo" in text
    assert paired == weighting["enabled"]
    assert ("ten paired seeds did not separate" in text) == (
        weighting["enabled"] and env == "suite"
    )


def test_report_without_a_config_makes_no_claim_about_the_loss(tmp_path):
    _write(tmp_path, [{"step": 0, "eval": _eval(0, [0.1] * 4, 1.0)}])

    assert "Loss:" not in Path(report.write_report(str(tmp_path))).read_text()
