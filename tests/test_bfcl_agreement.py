"""Agreement with bfcl_eval's own multi-turn checker: ground truth and a perturbed corpus."""

import contextlib
import itertools
import json
import random
import re

import pytest
from bfcl_eval.eval_checker.multi_turn_eval import multi_turn_utils
from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker import (
    multi_turn_checker,
    multi_turn_irrelevance_checker,
)

from environments.bfcl import all_task_ids, load_task, score
from environments.bfcl.tasks import raw_entries
from environments.policies import FINAL_ANSWER, oracle_turns

_counter = itertools.count()


def official_decode(text):
    """BFCL's QwenFCHandler.decode_execute + convert_to_function_call (copied: the handler
    module needs packages we do not install). Raises when BFCL would drop the message."""
    calls = []
    for block in re.findall(r"<tool_call>\n(.*?)\n</tool_call>", text, re.DOTALL):
        with contextlib.suppress(Exception):
            calls.append(json.loads(block))
    if any(type(item) is not dict for item in calls):
        raise ValueError("not a list of calls")
    decoded = []
    for item in calls:
        arguments = item["arguments"]
        if isinstance(arguments, str):
            arguments = json.loads(arguments)
        decoded.append(f"{item['name']}({','.join(f'{k}={v!r}' for k, v in arguments.items())})")
    return decoded


def official_verdict(task_id, assistant_turns, irrelevance=False):
    """The verdict of bfcl_eval's pipeline (eval_runner's decoding + multi_turn_checker), and
    with `irrelevance` also its multi_turn_irrelevance_checker (shipped, not run by the runner).
    """
    entry, answer = next(
        (e, a)
        for e, a in raw_entries(task_id.rsplit("_", 1)[0][len("multi_turn_") :])
        if e["id"] == task_id
    )
    if len(assistant_turns) != len(answer["ground_truth"]):
        return False  # eval_runner: "force_terminated"
    decoded_turns = []
    for messages in assistant_turns:
        steps = []
        for text in messages:
            try:
                decoded = official_decode(text)
            except Exception:
                continue
            if decoded:
                steps.append(decoded)
        decoded_turns.append(steps)
    model_name = f"reference_{next(_counter)}"
    category = task_id.rsplit("_", 1)[0]
    try:
        result = multi_turn_checker(
            decoded_turns, answer["ground_truth"], entry, category, model_name
        )
    finally:  # The checker caches instances in module globals; drop ours.
        for key in [k for k in vars(multi_turn_utils) if k.startswith(model_name)]:
            del vars(multi_turn_utils)[key]
    if irrelevance and result["valid"]:
        return multi_turn_irrelevance_checker(decoded_turns, answer["ground_truth"])["valid"]
    return result["valid"]


def test_ground_truth_passes_all_800_tasks():
    ids = all_task_ids()
    assert len(ids) == 800
    failures = [i for i in ids if not score(i, oracle_turns(load_task(i))).success]
    assert failures == []


def test_official_checker_accepts_the_oracle_on_a_sample():
    for task_id in all_task_ids()[::40]:
        assert official_verdict(task_id, oracle_turns(load_task(task_id)))


def _calls(message):
    return re.findall(r"<tool_call>\n.*?\n</tool_call>", message, re.DOTALL)


def _perturb(kind, turns, rng):
    """Returns a perturbed copy of oracle turns, or None when `kind` does not apply."""
    turns = [list(messages) for messages in turns]
    turn_calls = [[c for m in messages for c in _calls(m)] for messages in turns]
    with_calls = [i for i, calls in enumerate(turn_calls) if calls]
    empty = [i for i, calls in enumerate(turn_calls) if not calls]
    if kind == "early_stop":
        return turns[: rng.randrange(len(turns))]
    if kind == "calls_on_irrelevance_turn":
        if not empty or not with_calls:
            return None
        turns[rng.choice(empty)].insert(0, "\n".join(turn_calls[rng.choice(with_calls)]))
        return turns
    if not with_calls:
        return None
    turn = rng.choice(with_calls)
    calls = turn_calls[turn]  # the oracle makes one call per message: one message for all here
    if kind == "drop_call":
        del calls[rng.randrange(len(calls))]
    elif kind == "extra_call":
        calls.insert(rng.randrange(len(calls) + 1), rng.choice(calls))
    elif kind == "swap_order":
        if len(calls) < 2:
            return None
        i = rng.randrange(len(calls) - 1)
        calls[i], calls[i + 1] = calls[i + 1], calls[i]
    elif kind == "wrong_value":
        i = rng.randrange(len(calls))
        call = json.loads(calls[i][len("<tool_call>\n") : -len("\n</tool_call>")])
        if not call["arguments"]:
            return None
        key = rng.choice(sorted(call["arguments"]))
        value = call["arguments"][key]
        call["arguments"][key] = value + 1 if isinstance(value, int | float) else "wrong_value"
        calls[i] = f"<tool_call>\n{json.dumps(call)}\n</tool_call>"
    elif kind == "split_and_garble":  # Calls spread over messages, plus undecodable text.
        turns[turn] = [*calls, "<tool_call>\nnot json\n</tool_call>", FINAL_ANSWER]
        return turns
    elif kind == "hostile_calls":  # Private, dunder and unknown names run nothing.
        turns[turn].insert(0, "\n".join(HOSTILE_CALLS))
        return turns
    turns[turn] = ["\n".join(calls) if calls else FINAL_ANSWER, FINAL_ANSWER]
    return turns


HOSTILE_CALLS = [
    '<tool_call>\n{"name": "__init__", "arguments": {}}\n</tool_call>',
    '<tool_call>\n{"name": "_load_scenario", "arguments": {"scenario": {}}}\n</tool_call>',
    '<tool_call>\n{"name": "no_such_tool", "arguments": {"x": 1}}\n</tool_call>',
]
ACCEPTING_KINDS = (
    "extra_call",
    "swap_order",
    "calls_on_irrelevance_turn",
    "wrong_value",
    "split_and_garble",
    "hostile_calls",
)
REJECTING_KINDS = (
    "drop_call",
    "wrong_value",
    "extra_call",
    "calls_on_irrelevance_turn",
    "early_stop",
)

PERTURBATIONS = (
    "drop_call",
    "wrong_value",
    "extra_call",
    "swap_order",
    "calls_on_irrelevance_turn",
    "early_stop",
    "split_and_garble",
    "hostile_calls",
)


@pytest.mark.parametrize("kind", PERTURBATIONS)
def test_perturbed_corpus_matches_official_verdicts(kind):
    rng = random.Random(PERTURBATIONS.index(kind))
    verdicts = []
    for task_id in all_task_ids():
        turns = _perturb(kind, oracle_turns(load_task(task_id)), rng)
        if turns is None:
            continue
        ours = score(task_id, turns).success
        assert ours == official_verdict(task_id, turns), (task_id, turns)
        verdicts.append(ours)
    assert len(verdicts) > 20
    if kind in ACCEPTING_KINDS:
        assert any(verdicts), "corpus should contain cases the checker accepts"
    if kind in REJECTING_KINDS:
        assert not all(verdicts), "corpus should contain cases the checker rejects"


@pytest.mark.parametrize("kind", ["calls_on_irrelevance_turn", "hostile_calls", "early_stop"])
def test_strict_success_matches_the_official_irrelevance_check(kind):
    rng = random.Random(PERTURBATIONS.index(kind))
    verdicts = []
    for task_id in all_task_ids():
        if "miss" not in task_id:  # Only these categories have turns without ground truth.
            continue
        turns = _perturb(kind, oracle_turns(load_task(task_id)), rng)
        if turns is None:
            continue
        result = score(task_id, turns)
        assert result.strict_success == official_verdict(task_id, turns, irrelevance=True)
        verdicts.append((result.success, result.strict_success))
    if kind == "calls_on_irrelevance_turn":  # Accepted officially, rejected by the strict check.
        assert any(success and not strict for success, strict in verdicts)
