"""BFCL v4 memory, offline: verdicts agree with bfcl_eval's agentic runner (its decoder and
`agentic_checker`, called directly) on every question of both backends, the backends' state
matches what BFCL's own snapshot files hold, conversations chain per scenario, every episode has
its own backend, and the vector backend is reported unavailable."""

import json

import pytest
from bfcl_eval.constants.default_prompts import MAXIMUM_STEP_LIMIT
from bfcl_eval.eval_checker.agentic_eval.agentic_checker import agentic_checker
from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_utils import is_empty_execute_response
from bfcl_eval.utils import load_dataset_entry, load_ground_truth_entry

from environments.bfcl import extra, memory
from environments.bfcl.evaluate import run_episodes
from environments.policies import NoActionPolicy
from environments.rendering import Renderer
from environments.toolcall import ToolCall, render_tool_call
from tests.test_bfcl_agreement import official_decode

RETRIEVE = {"memory_kv": "core_memory_retrieve_all", "memory_rec_sum": "memory_retrieve"}


def official_verdict(answers, replies):
    """eval_runner's _evaluate_single_agentic_entry on one question's replies (one turn)."""
    last = None
    for reply in replies:
        try:
            decoded = official_decode(reply)
        except Exception:  # noqa: BLE001  (a reply the decoder refuses is a final answer)
            last = reply
            continue
        if is_empty_execute_response(decoded):
            last = reply
    return last is not None and agentic_checker(last, answers)["valid"]


def _call(name, **arguments):
    return render_tool_call(ToolCall(name, arguments))


def _replies(category, kind, task, other):
    """One question's scripted replies of a kind."""
    answer = memory.answer_text(task.answers[0])
    retrieve = _call(RETRIEVE[category])
    return {
        "ground_truth": [answer],
        "after_a_call": [retrieve, answer],
        "two_calls_in_one_reply": [retrieve + "\n" + retrieve, answer],
        "in_a_garbled_block": ["<tool_call>\nnot json\n</tool_call>\n" + answer],
        "do_not_know": [memory.answer_text("I do not know")],
        "another_answer": [memory.answer_text(other.answers[0])],
        "only_calls": [retrieve] * (MAXIMUM_STEP_LIMIT + 1),
    }[kind]


KINDS = (
    "ground_truth",
    "after_a_call",
    "two_calls_in_one_reply",
    "in_a_garbled_block",
    "do_not_know",
    "another_answer",
    "only_calls",
)


def _play(policy, task_ids, pool=None):
    pool = pool or extra.ExtraPool()
    return run_episodes(policy, task_ids, pool, 256, Renderer(prompt_style="release"))


@pytest.mark.parametrize("category", memory.CATEGORIES)
def test_verdicts_agree_with_bfcl_on_every_question(category):
    ids = memory.question_ids(category)
    answers = [a["ground_truth"] for a in load_ground_truth_entry(category)]
    assert len(ids) == len(answers) == 155
    tasks = [memory.load_task(i) for i in ids]
    assert [t.answers for t in tasks] == answers
    for kind in KINDS:
        others = {t.task_id: tasks[(n + 1) % len(tasks)] for n, t in enumerate(tasks)}
        script = {t.task_id: _replies(category, kind, t, others[t.task_id]) for t in tasks}
        results = _play(extra.ScriptedPolicy(script.__getitem__), ids)
        verdicts = []
        for task, result in zip(tasks, results):
            replies = [m["content"] for m in result.transcript if m["role"] == "assistant"]
            assert result.success == official_verdict(task.answers, replies), (task.task_id, kind)
            verdicts.append(result.success)
        if kind in ("ground_truth", "after_a_call", "two_calls_in_one_reply", "in_a_garbled_block"):
            assert all(verdicts), kind
        if kind in ("do_not_know", "only_calls"):
            assert not any(verdicts), kind
        if kind == "another_answer":
            assert verdicts.count(False) > 0.8 * len(verdicts)
    assert results[0].failure_reason == "step_limit"  # only_calls: BFCL's force-quit


def test_the_questions_are_bfcls():
    entries = load_dataset_entry("memory_rec_sum", include_prereq=False)
    task = memory.load_task(entries[0]["id"])
    assert task.turns == [[entries[0]["question"][0][1]]]
    assert task.instruction == entries[0]["question"][0][0]["content"]
    assert [d["name"] for d in task.docs] == [d["name"] for d in entries[0]["function"]]


@pytest.mark.parametrize("category", memory.CATEGORIES)
def test_states_are_what_bfcl_snapshots_hold(category, tmp_path):
    """Our state after a conversation equals the JSON BFCL's backend flushes, and an instance
    made from it equals one BFCL loads from that file."""
    first, second = memory.conversation_ids(category, "customer")[:2]
    official = memory.load_task(first).backend.create(None)
    config = {"model_result_dir": tmp_path, "scenario": "customer", "test_id": first}
    official._load_scenario(config)
    if category == "memory_kv":
        official.core_memory_add("user_name", "Michael")
        official.archival_memory_add("order_note", "Espresso machine, two accessories")
    else:
        official.memory_append("Michael, 35, Seattle.")
    official._flush_memory_to_local_file()
    state = memory.load_task(first).backend.state(official)
    (snapshot,) = tmp_path.rglob("customer_final.json")
    assert json.loads(snapshot.read_text()) == state
    reloaded = memory.load_task(first).backend.create(None)
    reloaded._load_scenario({**config, "test_id": second})
    ours = memory.load_task(second).backend.create(state)
    fields = memory.load_task(second).backend.state_fields
    assert {f: getattr(ours, f) for f in fields} == {f: getattr(reloaded, f) for f in fields}


def _chain_script(task_id):
    """Scripted replies: the first customer conversation remembers a name (core memory) and an
    order (archival), later ones acknowledge, the question reads archival memory."""
    task = memory.load_task(task_id)
    if task.answers is not None:
        return [_call("archival_memory_retrieve", key="order"), "Michael ordered it."]
    if task_id.endswith("-0"):
        remember = _call("core_memory_add", key="user_name", value="Michael")
        order = _call("archival_memory_add", key="order", value="espresso machine")
        return [remember, order, *[memory.ACKNOWLEDGEMENT] * len(task.turns)]
    return [memory.ACKNOWLEDGEMENT] * len(task.turns)


def test_conversations_chain_per_scenario_and_each_episode_has_its_own_backend():
    question = memory.question_ids("memory_kv")[0]
    assert memory.load_task(question).scenario == "customer"
    pool = extra.ExtraPool()

    def play(pool, task_ids):
        return _play(extra.ScriptedPolicy(_chain_script), task_ids, pool)

    results = extra.play_categories(["memory_kv"], play, pool, limit=1)
    chain = memory.conversation_ids("memory_kv", "customer")
    assert [i.rsplit("-", 1)[1] for i in chain] == [str(k) for k in range(len(chain))]
    assert [r.task_id for r in results] == [*chain, question]
    expected = {
        "core_memory": {"user_name": "Michael"},
        "archival_memory": {"order": "espresso machine"},
    }
    assert pool.states[("memory_kv", "customer")] == expected
    *_, asked = results
    assert '"user_name": "Michael"' in asked.transcript[0]["content"]  # core memory is shown
    assert asked.transcript[3] == {"role": "tool", "content": '{"value": "espresso machine"}'}

    # Two questions from the same state: what one does to its backend, the other never sees.
    clear = [_call("core_memory_clear"), _call("core_memory_retrieve_all"), "Cleared."]
    look = [_call("core_memory_retrieve_all"), "Looked."]
    ids = memory.question_ids("memory_kv")[:2]
    first, second = _play(
        extra.ScriptedPolicy({ids[0]: clear, ids[1]: look}.__getitem__), ids, pool
    )
    assert first.transcript[5]["content"] == "{}"
    assert second.transcript[3]["content"] == '{"user_name": "Michael"}'
    assert pool.states[("memory_kv", "customer")] == expected  # questions never write it back


def test_a_conversation_that_fails_leaves_the_state_as_it_was(monkeypatch):
    """The second conversation clears the memory, then its episode raises: as BFCL's runner
    (no snapshot written), the next conversation starts from the state the first one left."""
    step = memory.MemoryEpisode.step

    def failing_step(self, text):
        observation = step(self, text)
        if self.task.task_id.endswith("-1") and not self.instance.core_memory:
            raise RuntimeError("the model server went away")
        return observation

    def script(task_id):
        if task_id.endswith("-1"):
            return [_call("core_memory_clear"), memory.ACKNOWLEDGEMENT]
        return _chain_script(task_id)

    monkeypatch.setattr(memory.MemoryEpisode, "step", failing_step)
    pool = extra.ExtraPool()
    results = extra.play_categories(
        ["memory_kv"], lambda pool, ids: _play(extra.ScriptedPolicy(script), ids, pool), pool, 1
    )
    failed = next(r for r in results if r.task_id.endswith("-1"))
    assert failed.failure_reason == "error: RuntimeError: the model server went away"
    assert failed.memory_state is None
    assert pool.states[("memory_kv", "customer")]["core_memory"] == {"user_name": "Michael"}


def test_oracle_passes_and_noop_fails():
    for policy, expected in (
        (extra.ScriptedPolicy(extra.oracle_messages), 1.0),
        (NoActionPolicy(), 0.0),
    ):

        def play(pool, task_ids, policy=policy):
            return _play(policy, task_ids, pool)

        results = extra.play_categories(memory.CATEGORIES, play, extra.ExtraPool())
        accuracy = extra.summarize(results, memory.CATEGORIES, {})["accuracy"]
        assert accuracy == {"memory_kv": expected, "memory_rec_sum": expected}
        assert sum(r.category.endswith("_prereq") for r in results) == 2 * 37


def test_the_vector_backend_is_reported_unavailable_in_one_line():
    categories, unavailable = extra.resolve_categories(["memory_vector"])
    assert categories == [] and list(unavailable) == ["memory_vector"]
    assert "\n" not in unavailable["memory_vector"] and "offline" in unavailable["memory_vector"]
    with pytest.raises(ValueError, match="memory_vector: unavailable offline"):
        memory.check_category("memory_vector")
    assert extra.summarize([], categories, unavailable)["unavailable"] == unavailable
