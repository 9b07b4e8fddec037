"""The worker pool: batched episodes, agreement with `score`, crashed and hung workers."""

import os
import signal

import numpy as np
import pytest

from environments.bfcl import load_task, score, split_ids
from environments.policies import NoActionPolicy, OraclePolicy, oracle_turns
from environments.pool import EnvPool, PoolConfig
from environments.task import ToolTask
from environments.toolcall import ToolCall, render_tool_call


class Machine:
    def __init__(self):
        self.state = 0

    def work(self):
        self.state += 1
        return "worked"

    def crash(self):
        os._exit(7)

    def wedge(self):
        signal.setitimer(signal.ITIMER_REAL, 0)  # Defeat the per-call limit, like C code would.
        while True:
            pass


def load_toy_task(task_id):
    """Tasks "toy_<n>": one turn whose ground truth is work()."""
    if not task_id.startswith("toy_"):
        raise ValueError(f"unknown toy task {task_id!r}")
    docs = [
        {"name": n, "description": n, "parameters": {"type": "dict", "properties": {}}}
        for n in ("work", "crash", "wedge")
    ]
    return ToolTask(
        task_id,
        "toy",
        [[{"role": "user", "content": "Work."}]],
        docs,
        [["work()"]],
        {"Machine": Machine},
        {},
    )


def call(name):
    return render_tool_call(ToolCall(name, {}))


def play(pool, policy, task_ids):
    observations = pool.reset(task_ids)
    policy.start(task_ids)
    dones = np.zeros(len(task_ids), bool)
    steps = 0
    while not dones.all():
        texts = [None if d else t for t, d in zip(policy.act(observations), dones)]
        observations, dones = pool.step(texts)
        steps += 1
    return pool.results(), steps


@pytest.fixture(scope="module")
def bfcl_pool():
    with EnvPool(load_task, PoolConfig(num_workers=2)) as pool:
        yield pool


def test_batched_oracle_matches_score(bfcl_pool):
    ids = split_ids("eval")[::50]
    results, _ = play(bfcl_pool, OraclePolicy({i: load_task(i) for i in ids}), ids)
    assert [r.reward for r in results] == [1.0] * len(ids)
    for result, task_id in zip(results, ids, strict=True):
        reference = score(task_id, oracle_turns(load_task(task_id)))
        assert (result.task_id, result.turn_tags) == (task_id, reference.turn_tags)
        assert result.turn_causes == reference.turn_causes


def test_do_nothing_policy_scores_zero(bfcl_pool):
    ids = split_ids("eval")[:6]
    results, _ = play(bfcl_pool, NoActionPolicy(), ids)
    assert [r.reward for r in results] == [0.0] * 6
    assert all(r.turn_tags and "empty_turn_model_response" in r.turn_tags for r in results)


def test_bad_input_gets_one_clear_error(bfcl_pool):
    with pytest.raises(ValueError, match="no_such_task"):
        bfcl_pool.reset(["multi_turn_base_0", "multi_turn_no_such_task_1"])
    bfcl_pool.reset(["multi_turn_base_0"])
    with pytest.raises(ValueError, match="expected 1 messages"):
        bfcl_pool.step(["a", "b"])
    with pytest.raises(ValueError, match="need a message"):
        bfcl_pool.step([None])


class Scripted:
    def __init__(self, scripts):
        self.scripts = scripts

    def start(self, task_ids):
        self.queues = [list(s) for s in self.scripts]

    def act(self, observations):
        return [q.pop(0) if q else "Done." for q in self.queues]


@pytest.mark.parametrize(
    ("bad_call", "reason"), [("crash", "worker crashed (exit code"), ("wedge", "worker timed out")]
)
def test_failed_worker_is_replaced_and_its_episodes_fail(bad_call, reason):
    config = PoolConfig(num_workers=2, request_timeout_s=3.0)
    with EnvPool(load_toy_task, config) as pool:
        ids = ["toy_0", "toy_1", "toy_2", "toy_3"]
        # Episode 3 finishes first (kept), then episode 1 breaks worker 1, which holds 1 and 3.
        scripts = [
            [call("work"), "Done."],
            [call("work"), call(bad_call)],
            [call("work"), "Done."],
            ["Done."],
        ]
        results, _ = play(pool, Scripted(scripts), ids)
        assert results[1].failure_reason.startswith(reason)
        assert results[1].reward == 0.0 and results[1].turn_tags == []
        assert results[1].category == load_toy_task(results[1].task_id).category
        assert results[0].reward == results[2].reward == 1.0
        assert results[3].failure_reason is None  # finished before the crash, verdict kept
        again, _ = play(pool, Scripted([[call("work"), "Done."]] * 4), ids)
        assert [r.reward for r in again] == [1.0] * 4


def load_or_crash(task_id):
    """Like load_toy_task, but the worker process dies on "crash_<n>" ids."""
    if task_id.startswith("crash_"):
        os._exit(3)
    return load_toy_task(task_id)


def test_reset_without_any_worker_is_one_clear_error():
    with EnvPool(load_or_crash, PoolConfig(num_workers=1, request_timeout_s=10.0)) as pool:
        with pytest.raises(RuntimeError, match=r"no environment worker could start.*exit code 3"):
            pool.reset(["crash_0", "crash_1"])
        # The lost worker was replaced: the pool still runs episodes.
        results, _ = play(pool, Scripted([[call("work"), "Done."]]), ["toy_0"])
        assert [r.reward for r in results] == [1.0]
