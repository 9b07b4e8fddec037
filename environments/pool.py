"""A host-side pool of worker processes that run batches of episodes.

Why processes, not threads: the tool classes are pure Python, so threads would serialise on
the GIL; a call stuck in C code (say `10 ** 10 ** 9`) can only be stopped by killing its
process; and the per-call time limit uses SIGALRM, which works only on a process's main
thread. Workers are started with "spawn" so that nothing from a parent holding JAX (threads,
device handles) is forked.

Episode b lives in worker b % num_workers until it is done (its verdict comes back with its
last step). If a worker dies or misses the deadline of a request, it is killed and replaced,
and every unfinished episode it held ends as a failure with the reason recorded; the other
episodes go on.
"""

import contextlib
import multiprocessing
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from environments.episode import Episode, EpisodeConfig, EpisodeResult
from environments.rendering import Message, Renderer
from environments.task import ToolTask

TaskLoader = Callable[[str], ToolTask]


@dataclass(frozen=True)
class PoolConfig:
    """Pool settings.

    Attributes:
      num_workers: worker processes.
      episode: settings of every episode (mode, call budget, call time limit).
      request_timeout_s: how long one worker may take to answer one batched request before
        it is killed and replaced.
    """

    num_workers: int = 4
    episode: EpisodeConfig = field(default_factory=EpisodeConfig)
    request_timeout_s: float = 120.0


@dataclass(frozen=True)
class _Failure:
    """An episode that could not go on, and why (`worker_lost`: its worker died or hung)."""

    reason: str
    worker_lost: bool = False


def _worker_main(conn: object, load_task: TaskLoader, config: EpisodeConfig) -> None:
    """Serves requests until told to stop: each maps episode slots to inputs."""
    episodes: dict[int, Episode] = {}
    while True:
        command, payload = conn.recv()
        if command == "close":
            return
        if command == "reset":  # A new batch: drop whatever the last one left behind.
            episodes.clear()
        replies = {}
        for slot, value in payload.items():
            try:
                if command == "reset":
                    task_id, renderer = value
                    episodes[slot] = Episode(load_task(task_id), config, renderer)
                    replies[slot] = episodes[slot].reset()
                elif command == "step":
                    observation, done = episodes[slot].step(value)
                    result = episodes.pop(slot).result() if done else None
                    replies[slot] = (observation, done, result)
                else:
                    replies[slot] = episodes.pop(slot).result()
            except Exception as error:  # Reported per episode; the worker lives on.
                replies[slot] = _Failure(f"{type(error).__name__}: {error}")
        conn.send(replies)


def _crashed(process: multiprocessing.Process) -> _Failure:
    """The failure of a worker that died; its exit code once the process is reaped (its pipe
    closes first, so right after a crash the code may not be known yet)."""
    process.join(timeout=5.0)
    return _Failure(f"worker crashed (exit code {process.exitcode})", True)


class EnvPool:
    """Runs batches of episodes in worker processes.

    Usage:
      with EnvPool(load_task, PoolConfig(num_workers=4)) as pool:
          observations = pool.reset(task_ids)           # system prompt + first user turn
          while not dones.all():
              observations, dones = pool.step(texts)    # texts[b] ignored once b is done
          results = pool.results()
    """

    def __init__(self, load_task: TaskLoader, config: PoolConfig | None = None) -> None:
        self.config = config or PoolConfig()
        if self.config.num_workers < 1:
            raise ValueError(f"num_workers must be >= 1, got {self.config.num_workers}")
        self._load_task = load_task
        self._context = multiprocessing.get_context("spawn")
        self._workers = [self._start_worker() for _ in range(self.config.num_workers)]
        self._task_ids: list[str] = []
        self._dones = np.zeros(0, bool)
        self._failures: dict[int, str] = {}
        self._results: dict[int, EpisodeResult] = {}  # Episodes done, collected with their step.

    def __enter__(self) -> "EnvPool":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def reset(self, task_ids: list[str], renderer: Renderer | None = None) -> list[list[Message]]:
        """Starts one episode per task id; returns each one's opening messages.

        Args:
          task_ids: the batch's tasks (repeats allowed, e.g. G rollouts per task).
          renderer: the interface shown to the agent (default: the plain one).
        Raises:
          ValueError: a task could not be loaded (the message names it).
        """
        self._task_ids = list(task_ids)
        self._dones = np.zeros(len(task_ids), bool)
        self._failures = {}
        self._results = {}
        inputs = {b: (task_id, renderer) for b, task_id in enumerate(task_ids)}
        replies = self._request("reset", inputs)
        for b, reply in replies.items():
            if isinstance(reply, _Failure) and not reply.worker_lost:
                raise ValueError(f"cannot start episode for {task_ids[b]!r}: {reply.reason}")
        if replies and all(isinstance(reply, _Failure) for reply in replies.values()):
            raise RuntimeError(
                f"no environment worker could start an episode ({replies[0].reason}); workers "
                "are spawned, so a script that starts a pool needs an "
                "`if __name__ == '__main__':` guard"
            )
        return [
            [] if isinstance(replies[b], _Failure) else replies[b] for b in range(len(task_ids))
        ]

    def step(self, texts: list[str | None]) -> tuple[list[list[Message]], np.ndarray]:
        """Feeds one assistant message per episode; returns (observations, dones [B] bool)."""
        if len(texts) != len(self._task_ids):
            raise ValueError(f"expected {len(self._task_ids)} messages, got {len(texts)}")
        active = {b: text for b, text in enumerate(texts) if not self._dones[b]}
        missing = [b for b, text in active.items() if not isinstance(text, str)]
        if missing:
            raise ValueError(f"episodes {missing} are not done and need a message (str)")
        observations: list[list[Message]] = [[] for _ in texts]
        for b, reply in self._request("step", active).items():
            if not isinstance(reply, _Failure):
                observations[b], self._dones[b], result = reply
                if result is not None:
                    self._results[b] = result
        return observations, self._dones.copy()

    def stop(self, episodes: list[int]) -> None:
        """Ends these episodes as they stand, without another message (e.g. the policy ran out
        of context); their verdicts come from `results`, unfinished turns counting as not
        reached and the episode as "incomplete"."""
        self._dones[list(episodes)] = True

    def results(self) -> list[EpisodeResult]:
        """Returns the verdict of every episode of the batch, in order, and ends the batch.

        Unfinished turns count as not reached; an episode whose worker was lost is a failure
        without turn tags, with the reason recorded."""
        settled = self._failures.keys() | self._results.keys()
        pending = {b: None for b in range(len(self._task_ids)) if b not in settled}
        for b, reply in self._request("results", pending).items():
            if isinstance(reply, EpisodeResult):
                self._results[b] = reply
            else:
                self._failures.setdefault(b, reply.reason)
        episodes = []
        for b, task_id in enumerate(self._task_ids):
            if b in self._results:
                episodes.append(self._results[b])
            else:  # The worker's state is gone: a failure without turn tags.
                category = self._load_task(task_id).category
                episodes.append(
                    EpisodeResult(task_id, category, False, [], [], [], self._failures[b])
                )
        return episodes

    def close(self) -> None:
        """Stops all workers."""
        for process, conn in self._workers:
            with contextlib.suppress(BrokenPipeError, OSError):
                conn.send(("close", None))
            process.join(timeout=2)
            if process.is_alive():
                process.kill()
                process.join()
        self._workers = []

    def _start_worker(self) -> tuple:
        """Starts one worker process and returns (process, connection)."""
        parent, child = self._context.Pipe()
        process = self._context.Process(
            target=_worker_main, args=(child, self._load_task, self.config.episode), daemon=True
        )
        process.start()
        child.close()
        return process, parent

    def _request(self, command: str, inputs: dict[int, object]) -> dict[int, object]:
        """Sends each worker its episodes' inputs and gathers replies, replacing failed workers."""
        n = len(self._workers)
        by_worker = {w: {b: v for b, v in inputs.items() if b % n == w} for w in range(n)}
        by_worker = {w: items for w, items in by_worker.items() if items}
        for w, items in by_worker.items():
            self._send(w, (command, items))
        deadline = time.monotonic() + self.config.request_timeout_s
        replies = {}
        for w, items in by_worker.items():
            reply = self._receive(w, deadline)
            if isinstance(reply, _Failure):
                self._fail_worker(w, reply.reason)
                reply = dict.fromkeys(items, reply)
            replies.update(reply)
        for b, reply in replies.items():
            if isinstance(reply, _Failure) and command == "step":
                self._failures.setdefault(b, reply.reason)
                self._dones[b] = True
        return replies

    def _send(self, w: int, message: tuple) -> None:
        """Sends a request; a dead worker is noticed when its reply is awaited."""
        with contextlib.suppress(BrokenPipeError, OSError):
            self._workers[w][1].send(message)

    def _receive(self, w: int, deadline: float) -> object:
        """Waits for worker w's reply until the deadline; a _Failure if it died or hung."""
        process, conn = self._workers[w]
        try:
            if conn.poll(max(0.0, deadline - time.monotonic())):
                return conn.recv()
        except (EOFError, OSError):
            return _crashed(process)
        if not process.is_alive():
            return _crashed(process)
        return _Failure(f"worker timed out after {self.config.request_timeout_s} s", True)

    def _fail_worker(self, w: int, reason: str) -> None:
        """Kills worker w, starts a fresh one, and fails every unfinished episode it held."""
        process, conn = self._workers[w]
        process.kill()
        process.join()
        conn.close()
        self._workers[w] = self._start_worker()
        n = len(self._workers)
        for b in range(w, len(self._task_ids), n):
            if b not in self._results:
                self._failures.setdefault(b, reason)
                self._dones[b] = True
