"""The worker pool: batched and asynchronous episodes, agreement with `score`, crashed and hung
workers."""

import dataclasses
import os
import random
import signal
import time

import numpy as np
import pytest

from environments.bfcl import load_task, score, split_ids
from environments.policies import NoActionPolicy, OraclePolicy, oracle_turns
from environments.pool import EnvPool, PoolConfig, fault_kind
from environments.task import ToolTask
from environments.toolcall import ToolCall, render_tool_call

SLOW_S = 1.0  # How long the toy tool `slow` takes.


class Machine:
    def __init__(self):
        self.state = 0

    def work(self):
        self.state += 1
        return "worked"

    def slow(self):
        time.sleep(SLOW_S)
        return "slept"

    def crash(self):
        os._exit(7)

    def leak(self):
        self.kept = b"x" * (400 * 2**20)  # resident at once, unlike a lazily zeroed buffer
        time.sleep(30)

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
        for n in ("work", "slow", "crash", "leak", "wedge")
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


@pytest.fixture(scope="module")
def toy_pool():
    with EnvPool(load_toy_task, PoolConfig(num_workers=2, request_timeout_s=3.0)) as pool:
        yield pool


def drain(pool):
    """Polls until nothing is in flight; returns {episode: (observation, done)}."""
    finished = {}
    while pool.in_flight:
        finished.update((b, (obs, done)) for b, obs, done in pool.poll(timeout=None))
    return finished


def test_submit_returns_at_once_and_poll_does_not_wait_for_a_slow_episode(toy_pool):
    toy_pool.reset(["toy_0", "toy_1"])  # Episode b on worker b.
    start = time.monotonic()
    toy_pool.submit(0, call("slow"))
    toy_pool.submit(1, call("work"))
    (fast,) = toy_pool.poll(timeout=None)
    assert time.monotonic() - start < SLOW_S
    assert fast[0] == 1 and "worked" in fast[1][0]["content"] and not fast[2]
    assert toy_pool.in_flight == 1
    with pytest.raises(ValueError, match="already has a step in flight"):
        toy_pool.submit(0, "Done.")
    with pytest.raises(ValueError, match="in flight"):
        toy_pool.reset(["toy_0"])
    with pytest.raises(ValueError, match="poll"):
        toy_pool.step(["Done.", "Done."])
    toy_pool.submit(1, "Done.")
    finished = drain(toy_pool)
    assert "slept" in finished[0][0][0]["content"] and finished[1] == ([], True)
    with pytest.raises(ValueError, match="is done"):
        toy_pool.submit(1, "Done.")
    with pytest.raises(ValueError, match="no episode 2"):
        toy_pool.submit(2, "Done.")
    with pytest.raises(ValueError, match="needs a message"):
        toy_pool.submit(0, None)
    toy_pool.submit(0, "Done.")
    results = toy_pool.results()  # Waits for the step in flight.
    assert toy_pool.in_flight == 0 and toy_pool.poll(timeout=None) == []
    assert [(r.reward, r.failure_reason, r.model_calls) for r in results] == [
        (0.0, None, 2),
        (1.0, None, 2),
    ]


def test_submit_and_poll_in_any_order_match_step(bfcl_pool):
    ids = split_ids("eval")[::50]
    policy = OraclePolicy({i: load_task(i) for i in ids})
    batched = [[opening] for opening in bfcl_pool.reset(ids)]
    policy.start(ids)
    scripts = [[] for _ in ids]  # Each episode's messages, to replay asynchronously.
    dones = np.zeros(len(ids), bool)
    while not dones.all():
        texts = [None if d else t for t, d in zip(policy.act([o[-1] for o in batched]), dones)]
        observations, next_dones = bfcl_pool.step(texts)
        for b in np.flatnonzero(~dones):
            scripts[b].append(texts[b])
            batched[b].append(observations[b])
        dones = next_dones
    expected = bfcl_pool.results()

    rng = random.Random(0)
    seen = [[opening] for opening in bfcl_pool.reset(ids)]
    waiting = list(range(len(ids)))
    while waiting or bfcl_pool.in_flight:
        rng.shuffle(waiting)
        cut = rng.randint(0, len(waiting))
        for b in waiting[:cut]:
            bfcl_pool.submit(b, scripts[b].pop(0))
        waiting = waiting[cut:]
        for b, observation, done in bfcl_pool.poll(timeout=rng.choice([0.0, None])):
            seen[b].append(observation)
            if not done:
                waiting.append(b)
    assert seen == batched
    assert bfcl_pool.results() == expected


def test_a_hung_worker_fails_only_its_episodes_and_its_queued_steps(toy_pool):
    toy_pool.reset([f"toy_{b}" for b in range(6)])  # Worker 1 holds episodes 1, 3, 5.
    for b, name in [(1, "wedge"), (3, "work"), (0, "work"), (2, "work")]:
        toy_pool.submit(b, call(name))  # 3 waits behind 1, 2 behind 0; 5 has no step.
    batches = []
    while toy_pool.in_flight:
        batches.append(toy_pool.poll(timeout=None))
    finished = {b: (obs, done) for batch in batches for b, obs, done in batch}
    assert not finished[0][1] and not finished[2][1] and finished[0][0]
    # The step queued behind the hung one comes back with it, never sent to the new worker.
    assert sorted(next(batch for batch in batches if (1, [], True) in batch)) == [
        (1, [], True),
        (3, [], True),
    ]
    toy_pool.submit(5, "Done.")  # Ended by the loss while idle: reported, never sent.
    assert toy_pool.poll(timeout=0.0) == [(5, [], True)]
    with pytest.raises(ValueError, match="is done"):
        toy_pool.submit(1, "Done.")
    for b in (0, 2):
        toy_pool.submit(b, "Done.")
    drain(toy_pool)
    results = toy_pool.results()
    assert [r.reward for r in results] == [1.0, 0.0, 1.0, 0.0, 0.0, 0.0]
    for b in (1, 3, 5):
        assert results[b].failure_reason.startswith("worker timed out after 3.0 s")
        assert results[b].turn_tags == []


class Broken:
    def __init__(self):
        raise KeyError("scenario")


def load_toy_or_broken(task_id):
    """Like load_toy_task, but "broken_<n>" tasks have a tool class that raises on creation."""
    if not task_id.startswith("broken_"):
        return load_toy_task(task_id)
    return dataclasses.replace(load_toy_task("toy_0"), task_id=task_id, classes={"Broken": Broken})


def test_faults_stay_with_their_episodes_and_are_named():
    """A task whose own code raises fails its episode (the worker lives on); a worker that
    grows past its memory limit is replaced like a crashed one; fault_kind names each."""
    config = PoolConfig(num_workers=2, request_timeout_s=20.0, max_worker_rss_mb=300)
    with EnvPool(load_toy_or_broken, config) as pool:
        ids = ["toy_0", "broken_1", "toy_2", "toy_3"]  # episodes 1 and 3 on worker 1
        scripts = [[call("leak")], [], [call("work"), "Done."], [call("work"), "Done."]]
        results, _ = play(pool, Scripted(scripts), ids)
        reasons = [r.failure_reason for r in results]
        # Stopped while it leaked (its call sleeps past the 20 s deadline): episode 2 was on
        # the same worker and fails with it; episode 3 shares a worker with the raising task.
        assert (
            reasons[0].startswith("worker exceeded its memory limit (") and reasons[2] == reasons[0]
        )
        assert reasons[1] == "episode raised KeyError: 'scenario'"
        assert [r.reward for r in results] == [0.0, 0.0, 0.0, 1.0]
        kinds = ["worker_memory", "episode_raised", "worker_memory", None]
        assert [fault_kind(r) for r in reasons] == kinds
        again, _ = play(pool, Scripted([[call("work"), "Done."]] * 2), ["toy_0", "toy_1"])
        assert [r.reward for r in again] == [1.0, 1.0]
    assert fault_kind("worker crashed (exit code 7)") == "worker_crashed"
    assert fault_kind("worker timed out after 3.0 s") == "worker_timed_out"
    assert fault_kind("step_limit") is None
