"""BFCL's single-turn categories: our verdicts agree with bfcl_eval's own pipeline (its Qwen FC
decoder, relevance rule and AST checker, called directly) on the ground truth and on perturbed
replies over every task of every category; scripted policies; the command."""

import dataclasses
import json
import re
import subprocess
import sys
import types

import pytest
from bfcl_eval.utils import (
    is_empty_output,
    is_function_calling_format_output,
    is_relevance_or_irrelevance,
    load_dataset_entry,
    load_ground_truth_entry,
)

from environments.bfcl import extra, single_turn
from environments.bfcl.evaluate import run_episodes
from environments.policies import NoActionPolicy
from environments.rendering import Renderer
from tests.devices import REPO

# Ground truths no reply can pass: an ArrayList of `any` (read back as strings) against
# non-string answers, an answer without a required parameter, an answer with a parameter the
# function does not document.
UNPASSABLE = {
    "simple_java_36",
    "simple_java_65",
    "live_simple_106-63-0",
    "live_simple_112-68-0",
    "live_multiple_507-149-4",
    "live_multiple_862-181-3",
    "live_multiple_964-207-0",
}
BLOCK = re.compile(r"<tool_call>\n(.*?)\n</tool_call>", re.DOTALL)


def official_decode_ast(text):
    """QwenFCHandler.decode_ast with its _extract_tool_calls (copied: the handler module needs
    packages we do not install). Raises where BFCL's decoder raises."""
    calls = []
    for block in BLOCK.findall(text):
        try:
            calls.append(json.loads(block))
        except Exception:  # noqa: BLE001, S112  (the handler drops any block it cannot load)
            continue
    if any(type(item) is not dict for item in calls):
        raise ValueError("not a list of calls")
    return [{call["name"]: {k: v for k, v in call["arguments"].items()}} for call in calls]


def official_verdict(category, entry, answer, text):
    """eval_runner's _evaluate_single_relevance_entry / _evaluate_single_ast_entry on one reply.
    A checker that raises (which would stop BFCL's runner) counts as a rejection."""
    try:
        decoded = official_decode_ast(text)
    except Exception:  # noqa: BLE001
        decoded = None
    if is_relevance_or_irrelevance(category):
        called = decoded is not None and not is_empty_output(decoded)
        return not called if "irrelevance" in category else called
    if decoded is None or not is_function_calling_format_output(decoded):
        return False
    language = single_turn.language(category)
    try:
        checker = single_turn.official_ast_checker()
        return checker(entry["function"], decoded, answer, language, category, "Qwen_Qwen3-8B-FC")[
            "valid"
        ]
    except Exception:  # noqa: BLE001
        return False


def official_tasks(category):
    """(entry, answer) pairs as bfcl_eval's runner reads them (answers aligned by position)."""
    entries = load_dataset_entry(
        category, include_prereq=False, include_language_specific_hint=False
    )
    if is_relevance_or_irrelevance(category):
        return [(e, None) for e in entries]
    answers = load_ground_truth_entry(category)
    return [(e, a["ground_truth"]) for e, a in zip(entries, answers, strict=True)]


def _render(calls):
    return "\n".join(f"<tool_call>\n{json.dumps(call)}\n</tool_call>" for call in calls)


def _wrong(value):
    if isinstance(value, bool):
        return not value
    if isinstance(value, int | float):
        return value + 1
    if isinstance(value, list):
        return [*value, value[0]] if value else ["wrong_value"]
    if isinstance(value, dict):
        return {}
    return "wrong_value"


def perturbations(text, entry):
    """Perturbed replies of one task, by kind: changed values, renamed, added and dropped calls,
    undecodable and dropped blocks; for tasks without calls, calls where none belong."""
    calls = [json.loads(b) for b in BLOCK.findall(text)]
    if not calls:  # relevance / irrelevance: the reference makes no call
        name = entry["function"][0]["name"] if entry["function"] else "search"
        first = {"name": name, "arguments": {}}
        return {
            "a_call": _render([first]),
            "arguments_as_string": _render([{**first, "arguments": "{}"}]),
        }
    with_arguments = next((c for c in calls if c["arguments"]), None)
    kinds = {
        "wrong_function": _render([{**calls[0], "name": calls[0]["name"] + "_wrong"}, *calls[1:]]),
        "extra_call": _render([*calls, calls[0]]),
        "missing_call": _render(calls[:-1]) or "I cannot help.",
        "arguments_as_string": _render(
            [{**calls[0], "arguments": json.dumps(calls[0]["arguments"])}, *calls[1:]]
        ),
        "garbled_block_dropped": text + "\n<tool_call>\nnot json\n</tool_call>",
    }
    if with_arguments is not None:
        key = next(iter(with_arguments["arguments"]))
        changed = {**with_arguments["arguments"], key: _wrong(with_arguments["arguments"][key])}
        kinds["wrong_value"] = _render(
            [{**c, "arguments": changed} if c is with_arguments else c for c in calls]
        )
    return kinds


@pytest.mark.parametrize("category", single_turn.CATEGORIES)
def test_verdicts_agree_with_bfcl_on_ground_truth_and_perturbations(category):
    counts, passed = {}, []
    for entry, answer in official_tasks(category):
        task = single_turn.load_task(entry["id"])
        reference = single_turn.oracle_reply(task)
        ours, _ = single_turn.score_reply(task, reference)
        assert ours == official_verdict(category, entry, answer, reference), entry["id"]
        if ours:
            passed.append(entry["id"])
        for kind, text in perturbations(reference, entry).items():
            ours, _ = single_turn.score_reply(task, text)
            assert ours == official_verdict(category, entry, answer, text), (entry["id"], kind)
            counts.setdefault(kind, []).append(ours)
    ids = single_turn.task_ids(category)
    expected = set(ids) - UNPASSABLE - ({*ids} if category == "live_relevance" else set())
    assert set(passed) == expected
    if task.ground_truth is not None:
        for kind in ("wrong_function", "extra_call", "missing_call", "arguments_as_string"):
            assert not any(counts[kind]), kind
        assert counts["garbled_block_dropped"].count(True) == len(expected)
        assert counts["wrong_value"].count(False) > 0.8 * len(counts["wrong_value"])
    elif "irrelevance" in category:
        assert not any(counts["a_call"]) and all(counts["arguments_as_string"])
    else:
        assert all(counts["a_call"]) and not any(counts["arguments_as_string"])


def _accuracy(policy, categories):
    def play(pool, task_ids):
        return run_episodes(policy, task_ids, pool, 1024, Renderer(prompt_style="release"))

    results = extra.play_categories(categories, play, extra.ExtraPool())
    return extra.summarize(results, categories, {})["accuracy"]


def test_oracle_passes_and_noop_fails_except_where_no_call_is_right():
    oracle = _accuracy(extra.ScriptedPolicy(extra.oracle_messages), single_turn.CATEGORIES)
    noop = _accuracy(NoActionPolicy(), single_turn.CATEGORIES)
    for category in single_turn.CATEGORIES:
        ids = single_turn.task_ids(category)
        unpassable = len(UNPASSABLE & set(ids))
        if category == "live_relevance":  # no answers ship: the oracle has none to give
            assert oracle[category] == 0.0 and noop[category] == 0.0
        else:
            assert oracle[category] == pytest.approx(1 - unpassable / len(ids)), category
            assert noop[category] == float("irrelevance" in category), category


def test_the_prompt_is_bfcls_system_text_and_docs_with_the_language_hint():
    task = single_turn.load_task("live_simple_58-27-0")  # a question with a system message
    episode = single_turn.SingleTurnEpisode(task, Renderer(prompt_style="release"))
    system, *rest = episode.reset()
    assert task.messages[0]["role"] == "system"
    assert system["content"].startswith(task.messages[0]["content"] + "\n\n# Tools")
    assert "Note that the provided function is in Python 3 syntax." in system["content"]
    assert rest == [{"role": m["role"], "content": m["content"]} for m in task.messages[1:]]
    java = single_turn.load_task("simple_java_0")
    assert java.docs[0]["parameters"]["properties"]["controller"]["type"] == "string"
    assert java.checker_docs[0]["parameters"]["properties"]["controller"]["type"] == "any"


def test_a_checker_crash_or_a_failing_episode_fails_only_its_task(monkeypatch):
    task = single_turn.load_task("simple_python_0")
    broken = dataclasses.replace(task, checker_docs=[])
    passed, reason = single_turn.score_reply(broken, single_turn.oracle_reply(task))
    assert not passed and reason.startswith("the checker raised")

    ids = single_turn.task_ids("simple_python")[:3]
    original = single_turn.SingleTurnEpisode.verdict

    def verdict(self):
        if self.task.task_id == ids[1]:
            raise RuntimeError("boom")
        return original(self)

    monkeypatch.setattr(single_turn.SingleTurnEpisode, "verdict", verdict)
    pool = extra.ExtraPool()
    results = run_episodes(extra.ScriptedPolicy(extra.oracle_messages), ids, pool)
    assert [r.success for r in results] == [True, False, True]
    assert results[1].failure_reason == "error: RuntimeError: boom"
    assert extra.transcript_record(results[1])["transcript"][-1]["role"] == "assistant"


def test_other_tool_formats_are_decoded_as_the_multi_turn_environment_decodes_them():
    task = single_turn.load_task("simple_python_0")
    reply = "[calculate_triangle_area(base=10, height=5, unit='units')]"
    assert single_turn.score_reply(task, reply, "toolace") == (True, None)
    assert not single_turn.score_reply(task, reply)[0]  # not Qwen's format


def test_unknown_categories_are_named_with_the_valid_ones():
    with pytest.raises(ValueError, match="unknown BFCL category 'simple'.*simple_python"):
        extra.resolve_categories(["simple"])
    categories, unavailable = extra.resolve_categories(["irrelevance,memory", "memory_kv"])
    assert categories == ["irrelevance", "memory_kv", "memory_rec_sum"]
    assert list(unavailable) == ["memory_vector"]


def _command(tmp_path, *flags):
    args = [sys.executable, "-m", "environments.bfcl.evaluate_extra", f"--workdir={tmp_path}"]
    return subprocess.run(
        [*args, *flags], cwd=REPO, capture_output=True, text=True, timeout=300, check=False
    )


def test_the_command_writes_metrics_and_transcripts(tmp_path):
    proc = _command(tmp_path, "--categories=live_parallel,irrelevance,memory", "--limit=3")
    assert proc.returncode == 0, proc.stderr[-3000:]
    printed = json.loads(proc.stdout.strip().splitlines()[-1])
    assert printed["accuracy"] == {
        "live_parallel": 1.0,
        "irrelevance": 1.0,
        "memory_kv": 1.0,
        "memory_rec_sum": 1.0,
    }
    assert "memory_vector: unavailable offline" in proc.stderr
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["num_tasks"]["memory_kv"] == 3 and "memory_vector" in metrics["unavailable"]
    lines = [json.loads(line) for line in (tmp_path / "transcripts.jsonl").open()]
    assert sum(line["scored"] for line in lines) == 12
    assert all(not line["scored"] for line in lines if "prereq" in line["id"])

    bad = _command(tmp_path, "--categories=simple")
    assert bad.returncode == 2 and bad.stderr.startswith("error: unknown BFCL category 'simple'")


def test_run_eval_plays_what_fits_and_fails_a_prompt_too_long_alone(monkeypatch, tmp_path):
    """`run.py --mode=eval`'s hook, with the rollout engine replaced by the oracle: a prompt
    that leaves no room for a reply fails alone, the report lands in the given directory."""
    from configs.base import base_config
    from seal_jax import config as config_lib
    from seal_jax import evaluation

    def collect(engine, params, chat, pool, *, task_ids, renderer, **kwargs):
        policy = extra.ScriptedPolicy(extra.oracle_messages)
        return types.SimpleNamespace(results=run_episodes(policy, task_ids, pool, 64, renderer))

    monkeypatch.setattr(evaluation.episodes, "collect_episodes", collect)
    config = base_config()
    config.eval.extra_categories = ("live_parallel",)
    view = Renderer(prompt_style=config.interface.prompt_style)
    sizes = {
        i: len(extra.ExtraPool().reset([i], view)[0][0]["content"])
        for i in single_turn.task_ids("live_parallel")
    }
    limit = sorted(sizes.values())[len(sizes) // 2]
    engine = types.SimpleNamespace(
        config=types.SimpleNamespace(context_limit=limit + 1, max_new_tokens=1)
    )
    chat = types.SimpleNamespace(
        prompt_ids=lambda opening: [0] * len(opening[0]["content"]), tool_format="qwen"
    )
    summary = evaluation.evaluate_extra(engine, None, chat, config, 0, str(tmp_path))
    too_long = sum(size > limit for size in sizes.values())
    assert summary["accuracy"]["live_parallel"] == 1 - too_long / len(sizes)
    lines = [json.loads(line) for line in (tmp_path / "transcripts.jsonl").open()]
    reasons = [line["failure_reason"] for line in lines if not line["success"]]
    assert len(reasons) == too_long and all(r.startswith("prompt of") for r in reasons)

    config.eval.extra_categories = ("single",)
    with pytest.raises(config_lib.ConfigError, match="eval.extra_categories: unknown"):
        evaluation.extra_categories(config)
