"""Throughput of ground-truth replay: EnvPool with 1, 2, 4 workers vs bfcl_eval's checker path;
then how soon a fast episode's observation is back when one episode's tool call is slow.

    python -m benchmarks.bench_env_pool [--num_tasks=800] [--batch_size=128]

Both replay paths execute the same calls: the agent's (here the ground-truth oracle's) and the
ground truth's, then compare states and results. The package path calls
`multi_turn_checker` on already-decoded call strings in this one process. The latency line
compares the batched `step`, which returns when every episode's step has run, with
`submit`/`poll`, which return each step as its worker finishes it.
"""

import time

from absl import app, flags
from bfcl_eval.eval_checker.multi_turn_eval import multi_turn_utils
from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker import multi_turn_checker

from environments.bfcl import all_task_ids, load_task
from environments.bfcl.tasks import CATEGORIES, raw_entries
from environments.policies import OraclePolicy
from environments.pool import EnvPool, PoolConfig
from environments.task import ToolTask
from environments.toolcall import ToolCall, render_tool_call

FLAGS = flags.FLAGS
flags.DEFINE_integer("num_tasks", 800, "Tasks replayed (spread over the categories).")
flags.DEFINE_integer("batch_size", 128, "Episodes per pool batch.")

SLOW_CALL_S = 1.0  # The one slow tool call of the latency workload.


class Sleeper:
    """The latency workload's tools: `nap` is slow, `work` is not."""

    def nap(self) -> str:
        """Sleeps SLOW_CALL_S seconds."""
        time.sleep(SLOW_CALL_S)
        return "rested"

    def work(self) -> str:
        """Returns at once."""
        return "worked"


def load_sleeper_task(task_id: str) -> ToolTask:
    """One-turn tasks with the Sleeper tools (a module-level function: workers unpickle it)."""
    docs = [
        {"name": n, "description": n, "parameters": {"type": "dict", "properties": {}}}
        for n in ("nap", "work")
    ]
    turns = [[{"role": "user", "content": "Work."}]]
    return ToolTask(task_id, "sleeper", turns, docs, [["work()"]], {"Sleeper": Sleeper}, {})


def pool_replay(task_ids, num_workers, batch_size):
    """Seconds to replay all tasks through a warm pool."""
    with EnvPool(load_task, PoolConfig(num_workers=num_workers)) as pool:
        pool.reset(task_ids[:num_workers])  # Warm-up: workers started and imports done.
        policy = OraclePolicy({i: load_task(i) for i in task_ids})
        start = time.perf_counter()
        for first in range(0, len(task_ids), batch_size):
            batch = task_ids[first : first + batch_size]
            observations, dones = pool.reset(batch), [False] * len(batch)
            policy.start(batch)
            while not all(dones):
                texts = [None if d else t for t, d in zip(policy.act(observations), dones)]
                observations, dones = pool.step(texts)
            assert all(r.success for r in pool.results())
        return time.perf_counter() - start


def first_fast_observation(batch_size, num_workers=2):
    """Seconds until a fast episode's observation is back, when episode 0 calls `nap` and the
    others `work`: (batched step, submit/poll)."""
    texts = [render_tool_call(ToolCall("nap" if b == 0 else "work", {})) for b in range(batch_size)]
    ids = [f"sleeper_{b}" for b in range(batch_size)]
    with EnvPool(load_sleeper_task, PoolConfig(num_workers=num_workers)) as pool:
        pool.reset(ids)
        start = time.perf_counter()
        pool.step(texts)
        batched = time.perf_counter() - start
        pool.results()
        pool.reset(ids)
        start = time.perf_counter()
        for b, text in enumerate(texts):
            pool.submit(b, text)
        while not [b for b, _, _ in pool.poll(timeout=None) if b != 0]:
            pass
        asynchronous = time.perf_counter() - start
        pool.results()
    return batched, asynchronous


def checker_replay(task_ids):
    """Seconds for bfcl_eval's multi_turn_checker to verify the ground truth of all tasks."""
    entries = {e["id"]: (e, a) for c in CATEGORIES for e, a in raw_entries(c)}
    start = time.perf_counter()
    for n, task_id in enumerate(task_ids):
        entry, answer = entries[task_id]
        decoded = [[turn] if turn else [] for turn in answer["ground_truth"]]
        name = f"bench_{n}"
        category = task_id.rsplit("_", 1)[0]
        result = multi_turn_checker(decoded, answer["ground_truth"], entry, category, name)
        assert result["valid"], task_id
        for key in [k for k in vars(multi_turn_utils) if k.startswith(name)]:
            del vars(multi_turn_utils)[key]  # It caches instances in globals; free them.
    return time.perf_counter() - start


def main(argv):
    """Runs both paths and prints the table."""
    del argv
    ids = all_task_ids()
    ids = ids[:: max(1, len(ids) // FLAGS.num_tasks)][: FLAGS.num_tasks]
    calls = sum(len(turn) for i in ids for turn in load_task(i).ground_truth)
    rows = [("bfcl_eval multi_turn_checker (1 process)", checker_replay(ids))]
    for workers in (1, 2, 4):
        rows.append((f"EnvPool, {workers} worker(s)", pool_replay(ids, workers, FLAGS.batch_size)))
    print(f"{len(ids)} tasks, {calls} ground-truth tool calls each way")
    print(f"{'path':<44}{'seconds':>9}{'episodes/s':>12}{'tool calls/s':>14}")
    for name, seconds in rows:
        print(f"{name:<44}{seconds:>9.2f}{len(ids) / seconds:>12.1f}{calls / seconds:>14.1f}")
    batched, asynchronous = first_fast_observation(FLAGS.batch_size)
    print(
        f"first fast observation, {FLAGS.batch_size} episodes on 2 workers, one making a "
        f"{SLOW_CALL_S:.0f} s call: step {batched:.3f} s, submit/poll {asynchronous:.3f} s"
    )


if __name__ == "__main__":
    app.run(main)
