"""BFCL episodes: turns, reveals, the training/official switch, limits, split, TFDS, commands."""

import json
import re

import pytest
import tensorflow_datasets as tfds

from environments.bfcl import (
    all_task_ids,
    evaluate,
    load_task,
    score,
    score_jsonl,
    split_ids,
    tfds_builder,
)
from environments.bfcl.tasks import CATEGORIES, SPLIT_FILES, SPLIT_SEED, make_split
from environments.episode import Episode, EpisodeConfig
from environments.policies import FINAL_ANSWER, NoActionPolicy, OraclePolicy, oracle_turns
from environments.pool import EnvPool, PoolConfig
from environments.rendering import REVEAL_SUFFIX
from environments.summary import write_report
from environments.toolcall import ToolCall, render_tool_call

MISS_FUNC = "multi_turn_miss_func_0"  # `sort` is held back until turn 3


def call(name, **arguments):
    return render_tool_call(ToolCall(name, arguments))


def test_episode_walks_turns_and_reveals_held_back_functions():
    task = load_task(MISS_FUNC)
    episode = Episode(task)
    opening = episode.reset()
    assert [m["role"] for m in opening] == ["system", "user"]
    assert '"name": "sort"' not in opening[0]["content"]
    scripted = [m for turn in oracle_turns(task) for m in turn]
    observations = []
    for text in scripted:
        observation, done = episode.step(text)
        observations.append(observation)
    assert done and observation == []
    reveal = next(o for o in observations if o and REVEAL_SUFFIX in o[-1]["content"])
    assert reveal[-1]["role"] == "user" and '"name": "sort"' in reveal[-1]["content"]
    assert episode.result().success


def test_training_mode_refuses_hidden_tools_that_official_mode_runs():
    sort_early = call("sort", file_name="final_report.pdf")
    official = Episode(load_task(MISS_FUNC))
    official.reset()
    (ran,), _ = official.step(sort_early)
    assert ran["content"].startswith('{"error": "sort:')  # The tool itself answered.
    training = Episode(load_task(MISS_FUNC), EpisodeConfig(mode="training"))
    training.reset()
    (message,), done = training.step(sort_early)
    assert message["error_kind"] == "unknown_tool" and not done
    assert "sort" in message["content"]


def test_training_mode_refuses_bad_arguments_and_answers_unparseable_calls():
    episode = Episode(load_task("multi_turn_base_0"), EpisodeConfig(mode="training"))
    episode.reset()
    (message,), done = episode.step(call("cd", folder=5))
    assert message["error_kind"] == "wrong_type" and "folder" in message["content"] and not done
    (message,), done = episode.step(call("cd", folder="document", recursive=True))
    assert message["error_kind"] == "unexpected_argument"
    (message,), done = episode.step("<tool_call>\n{oops\n</tool_call>")
    assert message["error_kind"] == "unparseable" and not done
    assert episode.model.instances["GorillaFileSystem"]._current_dir.name == "workspace"
    official = Episode(load_task("multi_turn_base_0"))
    official.reset()
    observation, done = official.step("<tool_call>\n{oops\n</tool_call>")
    assert observation[0]["role"] == "user" and not done  # BFCL: no decodable call ends the turn


def test_step_limit_ends_the_episode_as_a_failure():
    task = load_task("multi_turn_base_0")
    episode = Episode(task, EpisodeConfig(max_model_calls=3))
    episode.reset()
    scripted = [m for turn in oracle_turns(task) for m in turn]
    done, steps = False, 0
    while not done:
        _, done = episode.step(scripted[steps])
        steps += 1
    result = episode.result()
    assert steps == 3 and result.failure_reason == "step_limit" and not result.success
    assert result.turn_tags[0] == "pass" and result.turn_tags[-1] == "empty_turn_model_response"


def test_long_context_tasks_load_long_scenarios():
    base = Episode(load_task("multi_turn_base_0")).model.instances["GorillaFileSystem"]
    long = Episode(load_task("multi_turn_long_context_0")).model.instances["GorillaFileSystem"]
    assert len(str(vars(long))) > 2 * len(str(vars(base)))


def test_score_returns_observations_and_rejects_bad_input():
    result = score("multi_turn_base_0", oracle_turns(load_task("multi_turn_base_0")))
    assert result.success and len(result.observations) == len(result.turn_tags) == 4
    assert result.observations[0][0]["role"] == "user"
    assert result.observations[0][1]["role"] == "tool"
    with pytest.raises(ValueError, match="user turns"):
        score("multi_turn_base_0", [[FINAL_ANSWER]] * 9)
    with pytest.raises(ValueError, match="not a BFCL"):
        score("base_0", [])


def test_split_is_the_committed_seeded_split():
    train, evaluation = split_ids("train", "seeded"), split_ids("eval", "seeded")
    committed = json.loads(SPLIT_FILES["seeded"].read_text())
    assert committed["seed"] == SPLIT_SEED
    assert {"train": train, "eval": evaluation} == make_split(SPLIT_SEED)
    assert sorted(train + evaluation) == sorted(all_task_ids())
    for category in CATEGORIES:
        assert sum(i.startswith(f"multi_turn_{category}_") for i in train) == 100


def test_tfds_builder_round_trips_tasks(tmp_path):
    tfds_builder.build(str(tmp_path))
    source = tfds.data_source("bfcl_multi_turn", split="eval", data_dir=str(tmp_path))
    assert len(source) == 400
    task = tfds_builder.decode(source[7])
    assert task.task_id in split_ids("eval")
    expected = load_task(task.task_id)
    assert (task.turns, task.docs, task.ground_truth) == (
        expected.turns,
        expected.docs,
        expected.ground_truth,
    )
    assert task.revealed_docs == expected.revealed_docs and task.classes == expected.classes
    never_built = tmp_path / "never_built"  # TFDS would try to build TFRecords (TensorFlow)
    command = f"python -m environments.bfcl.tfds_builder --data_dir={never_built}"
    with pytest.raises(FileNotFoundError, match=re.escape(command)):
        tfds.data_source("bfcl_multi_turn", split="eval", data_dir=str(never_built))


@pytest.mark.parametrize(("policy", "accuracy"), [("oracle", 1.0), ("noop", 0.0)])
def test_evaluation_writes_metrics_and_transcripts(tmp_path, policy, accuracy):
    ids = split_ids("eval")[::25]
    with EnvPool(load_task, PoolConfig(num_workers=2)) as pool:
        results = evaluate.run_episodes(evaluate.make_policy(policy, ids), ids, pool, batch_size=8)
    metrics = write_report(tmp_path, results, {"policy": policy}, CATEGORIES)
    assert metrics["mean"] == accuracy
    assert set(metrics["accuracy"]) == set(CATEGORIES)
    assert set(metrics["strict_accuracy"].values()) == {accuracy}  # the oracle never guesses
    saved = json.loads((tmp_path / "metrics.json").read_text())
    assert saved["tag_histogram"] == metrics["tag_histogram"]
    lines = (tmp_path / "transcripts.jsonl").read_text().splitlines()
    assert [json.loads(line)["id"] for line in lines] == ids
    assert json.loads(lines[0])["transcript"][0]["role"] == "system"


def test_scoring_a_jsonl_file(tmp_path):
    ids = ["multi_turn_base_3", "multi_turn_miss_param_5"]
    rows = [
        {"id": ids[0], "assistant_turns": oracle_turns(load_task(ids[0]))},
        {"id": ids[1], "result": [["no calls"]] * len(load_task(ids[1]).turns)},
    ]
    path = tmp_path / "responses.jsonl"
    path.write_text("\n".join(json.dumps(row) for row in rows))
    results, malformed = score_jsonl.score_file(path)
    assert [r.success for r in results] == [True, False] and malformed == []


def test_scripted_policies_shape():
    ids = ["multi_turn_base_0"]
    oracle = OraclePolicy({ids[0]: load_task(ids[0])})
    oracle.start(ids)
    assert oracle.act([[]])[0].startswith("<tool_call>")
    assert NoActionPolicy().act([[], []]) == [NoActionPolicy().act([[]])[0]] * 2


HOSTILE = [
    ("not json at all", None),
    ("<tool_call>\nnot json\n</tool_call>", "unparseable"),
    (
        "<tool_call>\n"
        + '{"name": "cd", "arguments": {"folder": "'
        + "x" * 200_000
        + '"}}'
        + "\n</tool_call>",
        "unparseable",
    ),
    (call("__import__('os').system('touch /tmp/pwned')", folder="x"), "unknown_tool"),
    (call("__init__"), "unknown_tool"),
    (call("_load_scenario", scenario={}), "unknown_tool"),
    (call("cd", folder="__import__('os').system('touch /tmp/pwned')"), None),
    (call("cd", folder=["document"]), "wrong_type"),
    (call("rm"), "missing_argument"),
]


@pytest.mark.parametrize("mode", ["training", "official"])
def test_hostile_messages_yield_errors_and_change_nothing(mode):
    episode = Episode(load_task("multi_turn_base_0"), EpisodeConfig(mode=mode, max_model_calls=99))
    episode.reset()
    before = repr(vars(episode.model.instances["GorillaFileSystem"]))
    for text, kind in HOSTILE:
        observation, _ = episode.step(text)
        if kind and (
            mode == "training" or kind not in ("unparseable", "wrong_type", "missing_argument")
        ):
            assert observation[0]["error_kind"] == kind
    assert repr(vars(episode.model.instances["GorillaFileSystem"])) == before
    causes = set().union(*episode.result().turn_causes)
    assert {"invalid_tool_call", "argument_mismatch"} <= causes
