"""The evaluation summary (environments.summary) and scoring files that lose no line
(environments.bfcl.score_jsonl)."""

import json
import subprocess
import sys

import pytest

from environments.bfcl import load_task, score
from environments.bfcl.score_jsonl import score_lines
from environments.episode import EpisodeResult
from environments.policies import oracle_turns
from environments.summary import summarize, write_report
from tests.devices import REPO


def result(task_id, category, success, tags, causes=None, reason=None):
    causes = causes if causes is not None else [set() for _ in tags]
    return EpisodeResult(task_id, category, success, tags, causes, [[] for _ in tags], reason)


def rederive(results, categories):
    """The summary, computed another way: per category, by hand."""
    present = []
    for r in results:
        if r.category not in present:
            present.append(r.category)
    order = [c for c in categories if c in present] + [c for c in present if c not in categories]
    accuracy, strict, tag_hist, cause_hist, tags = {}, {}, {}, {}, {}
    for c in order:
        group = [r for r in results if r.category == c]
        accuracy[c] = len([r for r in group if r.success]) / len(group)
        strict[c] = len(
            [r for r in group if r.success and "spurious_tool_call" not in r.turn_tags]
        ) / len(group)
        counts, cause_counts = {}, {}
        for r in group:
            for t in r.turn_tags:
                counts[t] = counts.get(t, 0) + 1
            for turn in r.turn_causes:
                for cause in turn:
                    cause_counts[cause] = cause_counts.get(cause, 0) + 1
        tag_hist[c] = {t: counts[t] for t in sorted(counts)}
        cause_hist[c] = {k: cause_counts[k] for k in sorted(cause_counts)}
    for r in results:
        for t in r.turn_tags:
            tags[t] = tags.get(t, 0) + 1
    mean = sum(accuracy.values()) / len(accuracy) if accuracy else 0.0
    strict_mean = sum(strict.values()) / len(strict) if strict else 0.0
    return {
        "num_tasks": len(results),
        "accuracy": accuracy,
        "mean": mean,
        "strict_accuracy": strict,
        "strict_mean": strict_mean,
        "tags": tags,
        "tag_histogram": tag_hist,
        "cause_histogram": cause_hist,
    }


RESULTS = [
    # A suite-style id with no BFCL prefix: the category comes from the result, not the id.
    result("files_eval-0", "files", True, ["pass", "pass"]),
    result("multi_turn_base_1", "base", False, ["pass", "recovery_failure"], [set(), {"b", "a"}]),
    result("multi_turn_base_2", "base", True, ["pass", "spurious_tool_call"], [set(), {"a"}]),
    result("weather-7", "weather", False, [], [], reason="worker_lost"),
    result("files_eval-1", "files", False, ["missing_tool_call"], [{"missing_tool_call"}]),
    result("multi_turn_base_3", "base", True, ["correct_abstention"]),
]


@pytest.mark.parametrize(
    "categories", [(), ("base",), ("weather", "nope", "base"), ("base", "files", "weather")]
)
def test_summary_matches_an_independent_derivation(categories):
    summary = summarize(RESULTS, categories)
    expected = rederive(RESULTS, categories)
    assert list(summary) == list(expected)
    for key in ("mean", "strict_mean"):
        assert summary.pop(key) == pytest.approx(expected.pop(key))
    assert summary == expected
    for key in ("accuracy", "strict_accuracy", "tags", "tag_histogram", "cause_histogram"):
        assert list(summary[key]) == list(expected[key]), key  # the report order, too
    assert list(summary["tag_histogram"]["base"]) == sorted(summary["tag_histogram"]["base"])


def test_summary_order_means_and_empty_input():
    summary = summarize(RESULTS, ("base",))
    assert list(summary["accuracy"]) == ["base", "files", "weather"]
    assert summary["accuracy"] == {"base": 2 / 3, "files": 0.5, "weather": 0.0}
    assert summary["strict_accuracy"]["base"] == 1 / 3  # spurious_tool_call fails strict
    assert summary["mean"] == float(sum([2 / 3, 0.5, 0.0]) / 3)
    assert summary["tags"] == {
        "pass": 4,
        "recovery_failure": 1,
        "spurious_tool_call": 1,
        "missing_tool_call": 1,
        "correct_abstention": 1,
    }
    assert summarize([]) == {
        "num_tasks": 0,
        "accuracy": {},
        "mean": 0.0,
        "strict_accuracy": {},
        "strict_mean": 0.0,
        "tags": {},
        "tag_histogram": {},
        "cause_histogram": {},
    }


def test_write_report_writes_the_summary_and_one_line_per_episode(tmp_path):
    metrics = write_report(tmp_path / "out", RESULTS, {"policy": "x"}, ("base",))
    assert metrics == {"policy": "x", **summarize(RESULTS, ("base",))}
    assert json.loads((tmp_path / "out" / "metrics.json").read_text()) == metrics
    lines = (tmp_path / "out" / "transcripts.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    assert [r["id"] for r in records] == [r.task_id for r in RESULTS]
    assert records[1]["turn_causes"] == [[], ["a", "b"]]
    assert records[3]["failure_reason"] == "worker_lost" and records[3]["category"] == "weather"


# --- score_jsonl ---------------------------------------------------------------------------

GOOD = ["multi_turn_base_3", "multi_turn_miss_param_5", "multi_turn_long_context_2"]


def good_lines():
    first = {"id": GOOD[0], "assistant_turns": oracle_turns(load_task(GOOD[0]))}
    second = {"id": GOOD[1], "result": [["no calls"]] * len(load_task(GOOD[1]).turns)}
    third = {"id": GOOD[2], "assistant_turns": oracle_turns(load_task(GOOD[2]))[:2]}
    return [json.dumps(first), json.dumps(second), json.dumps(third)]


def comparable(r):
    return (r.task_id, r.category, r.success, r.turn_tags, r.turn_causes, r.failure_reason)


def test_bad_lines_are_reported_and_the_rest_is_scored_as_alone():
    good = good_lines()
    alone, none = score_lines(good)
    assert none == [] and [r.success for r in alone] == [True, False, False]
    lines = [
        good[0],
        '{"id": "multi_turn_base_4", "assistant_turns": [["cut sh',  # 2: not JSON, id known
        "",
        json.dumps({"id": "multi_turn_base_5", "assistant_turns": "oops"}),  # 4: wrong shape
        good[1],
        json.dumps({"id": "multi_turn_base_9999", "assistant_turns": []}),  # 6: unknown id
        json.dumps({"id": "weather-7", "assistant_turns": []}),  # 7: not a BFCL id
        json.dumps({"id": GOOD[0], "assistant_turns": [["a second try"]]}),  # 8: duplicate
        "[1, 2]",  # 9: not an object
        json.dumps({"assistant_turns": []}),  # 10: no id
        "{not json",  # 11: not JSON, no id
        json.dumps({"id": "multi_turn_base_6", "assistant_turns": [["x"]] * 50}),  # 12: too many
        good[2],
    ]
    results, malformed = score_lines(lines)
    by_id = {r.task_id: r for r in results}
    assert [comparable(by_id[i]) for i in GOOD] == [comparable(r) for r in alone]
    assert [r.task_id for r in results] == [
        GOOD[0],
        "multi_turn_base_4",
        "multi_turn_base_5",
        GOOD[1],
        "multi_turn_base_6",
        GOOD[2],
    ]
    assert [(m["line"], m["id"], m["outcome"]) for m in malformed] == [
        (2, "multi_turn_base_4", "failure"),
        (4, "multi_turn_base_5", "failure"),
        (6, "multi_turn_base_9999", "skipped"),
        (7, "weather-7", "skipped"),
        (8, GOOD[0], "skipped"),
        (9, None, "skipped"),
        (10, None, "skipped"),
        (11, None, "skipped"),
        (12, "multi_turn_base_6", "failure"),
    ]
    assert "not JSON" in malformed[0]["error"] and "list of lists" in malformed[1]["error"]
    assert "line 1" in malformed[4]["error"] and "user turns" in malformed[8]["error"]
    for task_id, line in [("multi_turn_base_4", 2), ("multi_turn_base_5", 4)]:
        failed = by_id[task_id]
        assert not failed.success and failed.category == "base"
        assert failed.failure_reason.startswith(f"malformed line {line}:")
    # The failures count in accuracy: base has GOOD[0] (pass) and three malformed lines.
    assert summarize(results)["accuracy"]["base"] == 0.25
    assert comparable(score(GOOD[0], oracle_turns(load_task(GOOD[0])))) == comparable(alone[0])


def command(*args):
    return subprocess.run(
        [sys.executable, "-m", "environments.bfcl.score_jsonl", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_the_command_writes_everything_it_could_score(tmp_path):
    path = tmp_path / "responses.jsonl"
    path.write_text("\n".join([good_lines()[0], "{oops", good_lines()[1]]) + "\n")
    proc = command(f"--input={path}", f"--workdir={tmp_path / 'out'}")
    assert proc.returncode == 0, proc.stderr
    assert f"{path}:2" in proc.stderr and "Traceback" not in proc.stderr
    metrics = json.loads((tmp_path / "out" / "metrics.json").read_text())
    assert metrics["num_malformed_lines"] == 1 and metrics["malformed_lines"][0]["line"] == 2
    assert metrics["accuracy"] == {"base": 1.0, "miss_param": 0.0} and metrics["num_tasks"] == 2
    lines = (tmp_path / "out" / "transcripts.jsonl").read_text().splitlines()
    assert [json.loads(line)["id"] for line in lines] == GOOD[:2]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--input={tmp}/missing.jsonl", "--workdir={tmp}/out"], "cannot read --input="),
        (["--input={tmp}", "--workdir={tmp}/out"], "cannot read --input="),
        (["--input={tmp}/r.jsonl", "--workdir={tmp}/r.jsonl/out"], "cannot write to --workdir="),
        (["--workdir={tmp}/out"], "--input"),
    ],
)
def test_user_errors_are_one_line(tmp_path, args, message):
    (tmp_path / "r.jsonl").write_text(good_lines()[0])
    proc = command(*[a.format(tmp=tmp_path) for a in args])
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert lines[0].startswith("error: ") and message in lines[0]
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("module", "args", "message"),
    [
        ("environments.bfcl.evaluate", ["--limit=-1"], "--limit"),
        ("environments.suite.evaluate", ["--num_workers=0"], "--num_workers"),
        ("environments.suite.evaluate", ["--workdir={tmp}/file/out"], "cannot write to"),
        ("environments.suite.evaluate", ["--split=test"], "--split"),
    ],
)
def test_evaluation_user_errors_are_one_line(tmp_path, module, args, message):
    (tmp_path / "file").write_text("")
    argv = [f"--workdir={tmp_path}/out", *[a.format(tmp=tmp_path) for a in args]]
    proc = subprocess.run(
        [sys.executable, "-m", module, *argv], cwd=REPO, capture_output=True, text=True
    )
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert lines[0].startswith("error: ") and message in lines[0]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--workdir={tmp}/file/wd"], "cannot write to --workdir="),
        (
            ["--workdir={tmp}/wd", "--mode=export"],
            "no training checkpoint",
        ),  # before any warm start
        (["--workdir={tmp}/wd", "stray"], "unexpected argument(s) 'stray'"),
    ],
)
def test_run_py_user_errors_are_one_line(tmp_path, args, message):
    (tmp_path / "file").write_text("")
    argv = ["run.py", "--config=configs/tiny.py", *[a.format(tmp=tmp_path) for a in args]]
    proc = subprocess.run(
        [sys.executable, *argv], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert proc.returncode == 2 and len(errors) == 1 and message in errors[0], proc.stderr
    assert "Traceback" not in proc.stderr
