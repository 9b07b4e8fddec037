"""The generated suite: determinism, split, scripted policies, categories, errors, rendering."""

import dataclasses
import json
import os
import subprocess
import sys

import pytest

from environments.bfcl import score_task
from environments.bfcl.evaluate import run_episodes
from environments.episode import Episode, EpisodeConfig
from environments.policies import FINAL_ANSWER, NoActionPolicy, OraclePolicy, oracle_turns
from environments.pool import EnvPool, PoolConfig
from environments.rendering import REVEAL_SUFFIX, Renderer
from environments.suite import (
    CATEGORIES,
    category_of,
    load_task,
    load_tasks,
    make_tasks,
    score,
    split_ids,
)
from environments.suite.tasks import content_key
from environments.suite.tools import EXTRA_FILES
from environments.toolcall import ToolCall, parse_python_call, render_tool_call

ASK = "Which value should I use?"


def call(tool, **arguments):
    return render_tool_call(ToolCall(tool, arguments))


def find(split, category, predicate):
    """The first task of a split and category that satisfies predicate."""
    return next(t for t in load_tasks(split) if t.category == category and predicate(t))


def play(task, turns, mode="official"):
    """Plays assistant messages turn by turn; returns the EpisodeResult."""
    return score_task(task, turns, mode)


def test_generation_is_deterministic_across_processes():
    keys = [content_key(t) for t in make_tasks(11, 3)]
    assert keys == [content_key(t) for t in make_tasks(11, 3)]
    assert keys != [content_key(t) for t in make_tasks(12, 3)]
    script = (
        "import hashlib, json; from environments.suite import load_tasks; "
        "from environments.suite.tasks import content_key; "
        "print(hashlib.sha256(json.dumps([[t.task_id, content_key(t)] "
        "for s in ('train', 'eval') for t in load_tasks(s)]).encode()).hexdigest())"
    )
    digests = {
        subprocess.run(
            [sys.executable, "-c", script],
            env={**os.environ, "PYTHONHASHSEED": seed},
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        for seed in ("1", "2")
    }
    assert len(digests) == 1 and len(digests.pop().strip()) == 64


def test_splits_are_disjoint_in_content_and_sized_per_category():
    train, evaluation = load_tasks("train"), load_tasks("eval")
    for tasks, n in ((train, 100), (evaluation, 50)):
        assert [t.category for t in tasks] == [c for c in CATEGORIES for _ in range(n)]
        assert len({content_key(t) for t in tasks}) == len(tasks)
    assert not {content_key(t) for t in train} & {content_key(t) for t in evaluation}
    # The key ignores the id: the same draw under another tag is the same content.
    assert content_key(make_tasks(5, 1, tag="a")[0]) == content_key(make_tasks(5, 1, tag="b")[0])
    assert split_ids("eval")[0] == "multi_turn_base_eval-0"


def test_tasks_are_small():
    for task in load_tasks("train") + load_tasks("eval"):
        assert 1 <= len(task.turns) <= 3
        assert 2 <= len(task.docs) <= 4 and len(task.classes) <= 2
        assert all(len(calls) <= 2 for calls in task.ground_truth)
        for doc in task.docs:
            assert 0 <= len(doc["parameters"]["properties"]) <= 2


def test_bad_ids_and_splits_raise_one_clear_error():
    for bad in ("multi_turn_base_0", "multi_turn_base_test-1", "suite_base_eval-1", "x"):
        with pytest.raises(ValueError, match="suite task"):
            load_task(bad)
    with pytest.raises(ValueError, match="split must be"):
        load_tasks("test")
    assert category_of("multi_turn_miss_param_train-7") == "miss_param"


@pytest.mark.parametrize("mode", ["official", "training"])
def test_oracle_solves_everything_and_noop_nothing_through_the_pool(mode):
    ids = split_ids("eval") + split_ids("train")[::4]
    config = PoolConfig(num_workers=2, episode=EpisodeConfig(mode=mode))
    with EnvPool(load_task, config) as pool:
        oracle = OraclePolicy({i: load_task(i) for i in ids})
        solved = run_episodes(oracle, ids, pool, batch_size=128)
        failed = run_episodes(NoActionPolicy(), ids, pool, batch_size=128)
    assert [r.task_id for r in solved] == ids
    assert all(r.success for r in solved), [r.task_id for r in solved if not r.success]
    assert not any(r.success for r in failed)
    # Ground truth never runs into an error.
    assert not any(kinds for r in solved for kinds in r.turn_error_kinds)


def test_miss_param_guessing_fails_and_asking_passes():
    task = find("eval", "miss_param", lambda t: t.ground_truth[-1][0].startswith("set_lights"))
    truth = oracle_turns(task)
    asked = play(task, [*truth[:-2], [ASK], truth[-1]])
    assert asked.success and asked.turn_tags[-2] == "correct_abstention"
    given = task.ground_truth[-1][0].split("'")[1]
    invented = next(m for m in ("on", "off", "auto") if m != given)
    for guess in (invented, given):  # Even a lucky guess changes the state (one change more).
        guessed = play(task, [*truth[:-2], [call("set_lights", mode=guess), ASK], truth[-1]])
        assert not guessed.success
        assert guessed.turn_tags[-2:] == ["spurious_tool_call", "state_mismatch"]


def test_miss_func_reveals_the_tool_and_punishes_a_substitute():
    setters = {"set_ac", "set_lights"}
    task = find(
        "eval", "miss_func", lambda t: len(t.turns) == 2 and setters & {d["name"] for d in t.docs}
    )
    ((turn, (held,)),) = task.revealed_docs.items()
    assert turn == 1 and task.turns[1] == task.turns[0] and task.ground_truth[0] == []
    shown = [d["name"] for d in task.docs]
    assert held["name"] not in shown
    episode = Episode(task)
    system, _ = episode.reset()
    assert f'"name": "{held["name"]}"' not in system["content"]
    reveal, *request = episode.step(FINAL_ANSWER)[0]  # the tool first, then the request again
    assert REVEAL_SUFFIX in reveal["content"]
    assert f'"name": "{held["name"]}"' in reveal["content"]
    assert [m["content"] for m in request] == [m["content"] for m in task.turns[1]]
    truth = oracle_turns(task)
    assert play(task, truth).success
    wrong = call("set_ac", temp=20) if "set_ac" in shown else call("set_lights", mode="auto")
    failed = play(task, [[wrong, FINAL_ANSWER], truth[1]])
    assert not failed.success and failed.turn_tags[0] == "spurious_tool_call"
    # Training mode refuses the held-back tool before its reveal.
    early = play(task, [[truth[1][0], FINAL_ANSWER]], mode="training")
    assert early.turn_error_kinds[0][0] == "unknown_tool"


def test_long_context_shows_distracting_items():
    task = find("eval", "long_context", lambda t: t.ground_truth[0][0].startswith("list_files"))
    listings = []
    for variant in (task, dataclasses.replace(task, long_context=False)):
        episode = Episode(variant)
        episode.reset()
        (message,) = episode.act(oracle_turns(task)[0][0])
        listings.append(set(json.loads(message["content"])["files"]))
    long, short = listings
    assert short < long and long - short <= set(EXTRA_FILES)
    assert play(task, oracle_turns(task)).success


def test_schema_errors_are_refused_in_training_and_fail_officially():
    task = find("eval", "base", lambda t: t.ground_truth[0][0].startswith("set_lights"))
    bad = call("set_lights", mode="bright")
    training = play(task, [[bad, FINAL_ANSWER]], mode="training")
    assert training.turn_error_kinds[0] == ["enum_value"] and not training.success
    official = play(task, [[bad, FINAL_ANSWER]])
    assert not official.success and "argument_mismatch" in official.turn_causes[0]
    typed = play(task, [[call("set_ac", temp="20"), FINAL_ANSWER]], mode="training")
    assert typed.turn_error_kinds[0] == ["wrong_type"]


def first_call(task):
    """The second ground-truth call of the first turn, as the model would write it."""
    return render_tool_call(parse_python_call(task.ground_truth[0][1]))


def test_preconditions_explain_themselves_and_recovery_passes():
    task = find("eval", "base", lambda t: t.ground_truth[0][0] == "press_brake()")
    start = first_call(task)
    episode = Episode(task)
    episode.reset()
    (error,) = episode.act(start)
    assert error["error_kind"] == "tool_error" and "brake must be pressed" in error["content"]
    recovery = [start, call("press_brake") + "\n" + start, FINAL_ANSWER]
    assert play(task, [recovery, *oracle_turns(task)[1:]]).success
    skipped = play(task, [[start, FINAL_ANSWER], *oracle_turns(task)[1:]])
    assert not skipped.success and "recovery_failure" in skipped.turn_causes[0]


def test_login_and_missing_files_are_classified():
    task = find("eval", "base", lambda t: t.ground_truth[0][0].startswith("login("))
    action = first_call(task)
    episode = Episode(task)
    episode.reset()
    (error,) = episode.act(action)
    assert error["error_kind"] == "auth_required" and "log in" in error["content"]
    login = render_tool_call(parse_python_call(task.ground_truth[0][0]))
    recovery = [action, login, action, FINAL_ANSWER]
    assert play(task, [recovery, *oracle_turns(task)[1:]]).success
    files = find("eval", "base", lambda t: t.ground_truth[0][0].startswith("read_file"))
    episode = Episode(files)
    episode.reset()
    (missing,) = episode.act(call("read_file", name="nope.txt"))
    assert missing["error_kind"] == "not_found" and "no such file nope.txt" in missing["content"]


def test_prompts_render_through_the_standard_renderer():
    task = find("eval", "miss_func", lambda t: True)
    episode = Episode(task)
    system, user = episode.reset()
    assert system == Renderer().system(task.docs, task.system_preamble)
    assert system["content"].startswith(task.system_preamble + "\n\n# Tools")
    block = system["content"].split("<tools>\n")[1].split("\n</tools>")[0]
    tools = [json.loads(line) for line in block.splitlines()]
    assert [t["function"]["name"] for t in tools] == [d["name"] for d in task.docs]
    assert all(t["function"]["parameters"]["type"] == "object" for t in tools)
    assert user == {"role": "user", "content": task.turns[0][0]["content"]}


def test_score_and_the_evaluation_command(tmp_path):
    task_id = split_ids("eval")[60]
    assert score(task_id, oracle_turns(load_task(task_id))).success
    assert not score(task_id, [["no"]]).success
    with pytest.raises(ValueError, match="user turns"):
        score(task_id, [["no"]] * 9)
    command = [sys.executable, "-m", "environments.suite.evaluate", "--policy=oracle"]
    command += ["--split=eval", f"--workdir={tmp_path}", "--limit=8", "--num_workers=1"]
    subprocess.run(command, check=True, capture_output=True)
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["mean"] == 1.0 and metrics["num_tasks"] == 8
    lines = (tmp_path / "transcripts.jsonl").read_text().splitlines()
    assert [json.loads(line)["id"] for line in lines] == split_ids("eval")[:8]
