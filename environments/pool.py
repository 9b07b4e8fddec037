"""A host-side pool of worker processes that run batches of episodes.

Why processes, not threads: the tool classes are pure Python, so threads would serialise on
the GIL; a call stuck in C code (say `10 ** 10 ** 9`) can only be stopped by killing its
process; and the per-call time limit uses SIGALRM, which works only on a process's main
thread. Workers are started with "spawn" so that nothing from a parent holding JAX (threads,
device handles) is forked.

Episode b lives in worker b % num_workers until it is done (its verdict comes back with its
last step). Steps are asynchronous: `submit` queues one episode's message and returns at once,
`poll` hands back the steps that have finished, so a slow tool call holds up only its own
worker; the batched `step` is submit for every episode, then poll until all are back. Each
worker has at most one request in flight (two processes blocked sending big messages to each
other would deadlock); steps queued behind it go together in its next request.

Faults stay with their episodes. An episode whose own code raises (its task's tool classes
failing to start, a verifier bug) ends as a failure with the exception recorded; the worker lives
on. A worker that dies, misses the deadline of a request (`request_timeout_s`: no step waits
longer) or grows past `max_worker_rss_mb` is killed and replaced, and every unfinished episode it
held ends as a failure with the reason recorded (steps queued for it are never sent); the other
episodes go on. `fault_kind` names the fault behind a failure reason, for counting. Workers
ignore SIGINT and SIGTERM: the pool's owner decides when they stop (`close`).
"""

import contextlib
import multiprocessing
import os
import signal
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import wait

import numpy as np

from environments.episode import Episode, EpisodeConfig, EpisodeResult
from environments.rendering import Message, Renderer
from environments.task import ToolTask

TaskLoader = Callable[[str], ToolTask]
StepReply = tuple[int, list[Message], bool]  # (episode, observation messages, done)


@dataclass(frozen=True)
class PoolConfig:
    """Pool settings.

    Attributes:
      num_workers: worker processes.
      episode: settings of every episode (mode, call budget, call time limit).
      request_timeout_s: how long one worker may take to answer one request (counted from
        when it was sent) before it is killed and replaced.
      max_worker_rss_mb: the resident memory a busy worker may reach (checked every
        MEMORY_CHECK_S while it works) before it is killed and replaced; 0: no limit (the check
        reads /proc, so it applies on Linux only).
    """

    num_workers: int = 4
    episode: EpisodeConfig = field(default_factory=EpisodeConfig)
    request_timeout_s: float = 120.0
    max_worker_rss_mb: float = 0.0


STARTUP_TIMEOUT_S = 120.0  # how long a new worker may take to start (imports on a busy machine)
READY = "ready"  # a new worker's first message
MEMORY_CHECK_S = 0.25  # how often a busy worker's memory is read when there is a limit
# Failure reasons of environment faults by their opening words (`fault_kind`).
FAULTS = {
    "worker crashed": "worker_crashed",
    "worker timed out": "worker_timed_out",
    "worker exceeded": "worker_memory",
    "episode raised": "episode_raised",
}


def fault_kind(reason: str | None) -> str | None:
    """The environment fault behind an episode's failure reason (a value of FAULTS), or None
    for an episode that ended by its own rules (None, "step_limit", "incomplete")."""
    for opening, kind in FAULTS.items():
        if reason and reason.startswith(opening):
            return kind
    return None


@dataclass(frozen=True)
class _Failure:
    """An episode that could not go on, and why (`worker_lost`: its worker died, hung or grew
    too big; `bad_task`: its task id does not load)."""

    reason: str
    worker_lost: bool = False
    bad_task: bool = False


@dataclass(frozen=True)
class _Request:
    """A request a worker has not answered yet: its command, episodes and deadline."""

    command: str
    episodes: list[int]
    deadline: float


def _worker_main(conn: object, load_task: TaskLoader, config: EpisodeConfig) -> None:
    """Serves requests until told to stop: each maps episode slots to inputs."""
    for s in (signal.SIGINT, signal.SIGTERM):
        signal.signal(s, signal.SIG_IGN)
    conn.send(READY)
    episodes: dict[int, Episode] = {}
    while True:
        command, payload = conn.recv()
        if command == "close":
            return
        if command == "reset":  # A new batch: drop whatever the last one left behind.
            episodes.clear()
        replies = {}
        for slot, value in payload.items():
            if command == "reset":
                try:
                    task = load_task(value[0])
                except Exception as error:
                    replies[slot] = _Failure(f"{type(error).__name__}: {error}", bad_task=True)
                    continue
            try:
                if command == "reset":
                    episodes[slot] = Episode(task, config, value[1])
                    replies[slot] = episodes[slot].reset()
                elif command == "step":
                    observation, done = episodes[slot].step(value)
                    result = episodes.pop(slot).result() if done else None
                    replies[slot] = (observation, done, result)
                else:
                    replies[slot] = episodes.pop(slot).result()
            except Exception as error:  # Reported per episode; the worker lives on.
                replies[slot] = _Failure(f"episode raised {type(error).__name__}: {error}")
        conn.send(replies)


def _crashed(process: multiprocessing.Process) -> _Failure:
    """The failure of a worker that died; its exit code once the process is reaped (its pipe
    closes first, so right after a crash the code may not be known yet)."""
    process.join(timeout=5.0)
    return _Failure(f"worker crashed (exit code {process.exitcode})", True)


class EnvPool:
    """Runs batches of episodes in worker processes.

    Batched, every episode one step at a time:
      with EnvPool(load_task, PoolConfig(num_workers=4)) as pool:
          observations = pool.reset(task_ids)           # system prompt + first user turn
          while not dones.all():
              observations, dones = pool.step(texts)    # texts[b] ignored once b is done
          results = pool.results()

    Asynchronous, each episode at its own pace (`generate` stands for the policy):
      observations = pool.reset(task_ids)
      waiting = set(range(len(task_ids)))               # episodes that need a message
      while waiting or pool.in_flight:
          for b in waiting:
              pool.submit(b, generate(observations[b]))  # returns at once
          waiting = set()
          for b, observation, done in pool.poll(timeout=None):  # whatever has finished
              observations[b] = observation
              if not done:
                  waiting.add(b)
      results = pool.results()

    Every submitted step comes back from `poll` exactly once. An episode that a lost worker
    ended while it had no step in flight is still accepted by `submit`, and `poll` returns it
    as (b, [], True) without sending anything.
    """

    def __init__(self, load_task: TaskLoader, config: PoolConfig | None = None) -> None:
        self.config = config or PoolConfig()
        if self.config.num_workers < 1:
            raise ValueError(f"num_workers must be >= 1, got {self.config.num_workers}")
        self._load_task = load_task
        self._context = multiprocessing.get_context("spawn")
        self._workers = [self._spawn() for _ in range(self.config.num_workers)]
        for worker in self._workers:  # started together, awaited in turn
            self._await_ready(*worker)
        self._sent: list[_Request | None] = [None] * self.config.num_workers
        self._queues: list[deque[tuple[int, str]]] = [deque() for _ in self._workers]
        self._task_ids: list[str] = []
        self._dones = np.zeros(0, bool)
        self._failures: dict[int, str] = {}
        self._results: dict[int, EpisodeResult] = {}  # Episodes done, collected with their step.
        self._pending: set[int] = set()  # Submitted, not yet returned by poll.
        self._finished: list[StepReply] = []  # Back from the workers, not yet returned by poll.
        self._lost: set[int] = set()  # Ended by a worker loss; poll has not said so yet.

    def __enter__(self) -> "EnvPool":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @property
    def in_flight(self) -> int:
        """Steps submitted and not yet returned by `poll`."""
        return len(self._pending)

    def reset(self, task_ids: list[str], renderer: Renderer | None = None) -> list[list[Message]]:
        """Starts one episode per task id; returns each one's opening messages.

        Args:
          task_ids: the batch's tasks (repeats allowed, e.g. G rollouts per task).
          renderer: the interface shown to the agent (default: the plain one).
        An episode that cannot start (its worker was lost, or its task's code raised) opens
        with [] and ends as a failure with the reason recorded.

        Raises:
          ValueError: a task id does not load (the message names it), or steps are in flight.
        """
        if self._pending:
            raise ValueError(
                f"{len(self._pending)} steps are in flight: poll() them or call results() first"
            )
        self._task_ids = list(task_ids)
        self._dones = np.zeros(len(task_ids), bool)
        self._failures = {}
        self._results = {}
        self._lost = set()
        inputs = {b: (task_id, renderer) for b, task_id in enumerate(task_ids)}
        replies = self._request("reset", inputs)
        for b, reply in replies.items():
            if isinstance(reply, _Failure) and reply.bad_task:
                raise ValueError(f"cannot start episode for {task_ids[b]!r}: {reply.reason}")
            if isinstance(reply, _Failure) and not reply.worker_lost:  # the episode raised
                self._failures[b], self._dones[b] = reply.reason, True
                self._lost.add(b)
        if replies and all(
            isinstance(reply, _Failure) and reply.worker_lost for reply in replies.values()
        ):
            raise RuntimeError(
                f"no environment worker could start an episode ({replies[0].reason}); workers "
                "are spawned, so a script that starts a pool needs an "
                "`if __name__ == '__main__':` guard"
            )
        return [
            [] if isinstance(replies[b], _Failure) else replies[b] for b in range(len(task_ids))
        ]

    def step(self, texts: list[str | None]) -> tuple[list[list[Message]], np.ndarray]:
        """Feeds one assistant message per episode; returns (observations, dones [B] bool).

        Raises:
          ValueError: a message count other than the batch's, a missing message for an episode
            that is not done, or steps already in flight from `submit`.
        """
        if len(texts) != len(self._task_ids):
            raise ValueError(f"expected {len(self._task_ids)} messages, got {len(texts)}")
        if self._pending:
            raise ValueError(f"{len(self._pending)} submitted steps are in flight; poll() first")
        active = {b: text for b, text in enumerate(texts) if not self._dones[b]}
        missing = [b for b, text in active.items() if not isinstance(text, str)]
        if missing:
            raise ValueError(f"episodes {missing} are not done and need a message (str)")
        for b, text in active.items():  # Queue them all first: one request per worker.
            self._enqueue(b, text)
        for w in range(len(self._workers)):
            self._dispatch(w)
        observations: list[list[Message]] = [[] for _ in texts]
        while self._pending:
            for b, observation, _ in self.poll(timeout=None):
                observations[b] = observation
        return observations, self._dones.copy()

    def submit(self, episode: int, text: str) -> None:
        """Queues one assistant message of `episode` for its worker and returns at once; `poll`
        returns the step once it has run.

        Raises:
          ValueError: no such episode, `text` is not a str, the episode is done, or it already
            has a step in flight.
        """
        self._enqueue(episode, text)
        self._dispatch(int(episode) % len(self._workers))

    def poll(self, timeout: float | None = 0.0) -> list[StepReply]:
        """Returns the steps finished since the last call, in order of arrival, as (episode,
        observation messages, done); an episode whose worker was lost comes back as
        (episode, [], True), the reason kept for `results`.

        Args:
          timeout: seconds to wait for at least one step (None: as long as it takes). With
            nothing in flight it returns [] at once.
        """
        end = None if timeout is None else time.monotonic() + timeout
        self._take_steps(self._collect(0.0))
        while not self._finished and any(self._sent):
            remaining = None if end is None else end - time.monotonic()
            if remaining is not None and remaining <= 0:
                break
            self._take_steps(self._collect(remaining))
        finished, self._finished = self._finished, []
        self._pending.difference_update(b for b, _, _ in finished)
        return finished

    def stop(self, episodes: list[int]) -> None:
        """Ends these episodes as they stand, without another message (e.g. the policy ran out
        of context); their verdicts come from `results`, unfinished turns counting as not
        reached and the episode as "incomplete". A step already submitted still runs, and
        `poll` reports it done."""
        self._dones[list(episodes)] = True

    def results(self) -> list[EpisodeResult]:
        """Returns the verdict of every episode of the batch, in order, and ends the batch.

        Steps still in flight are waited for first (their observations are dropped).
        Unfinished turns count as not reached; an episode whose worker was lost is a failure
        without turn tags, with the reason recorded."""
        while self._pending:
            self.poll(timeout=None)
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

    def _spawn(self) -> tuple:
        """Starts one worker process and returns (process, connection)."""
        parent, child = self._context.Pipe()
        process = self._context.Process(
            target=_worker_main, args=(child, self._load_task, self.config.episode), daemon=True
        )
        process.start()
        child.close()
        return process, parent

    def _await_ready(self, process: multiprocessing.Process, conn: object) -> None:
        """Waits until a new worker has started (imported the task loader's modules), so that a
        request's deadline counts only its work, not the start-up of a busy machine.

        Raises:
          RuntimeError: the worker died or did not start in STARTUP_TIMEOUT_S.
        """
        try:
            if conn.poll(STARTUP_TIMEOUT_S) and conn.recv() == READY:
                return
        except (EOFError, OSError):
            pass
        process.kill()
        raise RuntimeError(
            f"an environment worker did not start ({_crashed(process).reason}); workers are "
            "spawned, so a script that starts a pool needs an `if __name__ == '__main__':` guard"
        )

    def _enqueue(self, episode: int, text: str) -> None:
        """Checks one step and queues it for the episode's worker (an episode a lost worker
        ended goes straight to the finished steps)."""
        if not isinstance(episode, int | np.integer) or not 0 <= episode < len(self._task_ids):
            raise ValueError(f"no episode {episode!r} in a batch of {len(self._task_ids)}")
        b = int(episode)
        if not isinstance(text, str):
            raise ValueError(f"episode {b} needs a message (str), got {type(text).__name__}")
        if b in self._pending:
            raise ValueError(f"episode {b} already has a step in flight; poll() for it first")
        if b in self._lost:
            self._lost.discard(b)
            self._finished.append((b, [], True))
        elif self._dones[b]:
            raise ValueError(f"episode {b} is done")
        else:
            self._queues[b % len(self._workers)].append((b, text))
        self._pending.add(b)

    def _dispatch(self, w: int) -> None:
        """Sends worker w, if idle, every step queued for it as one request."""
        if self._sent[w] is None and self._queues[w]:
            steps = dict(self._queues[w])
            self._queues[w].clear()
            self._send(w, "step", steps)

    def _request(self, command: str, inputs: dict[int, object]) -> dict[int, object]:
        """Sends each worker its episodes' inputs and gathers replies, replacing failed workers.
        Only while no step is in flight."""
        n = len(self._workers)
        for w in range(n):
            items = {b: value for b, value in inputs.items() if b % n == w}
            if items:
                self._send(w, command, items)
        replies = {}
        while any(self._sent):
            replies.update(self._collect(None))
        return replies

    def _send(self, w: int, command: str, items: dict[int, object]) -> None:
        """Sends worker w a request; a dead worker is noticed when its reply is awaited."""
        with contextlib.suppress(BrokenPipeError, OSError):
            self._workers[w][1].send((command, items))
        deadline = time.monotonic() + self.config.request_timeout_s
        self._sent[w] = _Request(command, list(items), deadline)

    def _collect(self, timeout: float | None) -> dict[int, object]:
        """Waits up to `timeout` s (None: until a reply or a deadline) for busy workers; returns
        the per-episode replies of the requests answered, failed or past their deadline."""
        busy = {self._workers[w][1]: w for w, request in enumerate(self._sent) if request}
        if not busy:
            return {}
        first_deadline = min(self._sent[w].deadline for w in busy.values())
        wait_s = max(0.0, first_deadline - time.monotonic())
        if self.config.max_worker_rss_mb:
            wait_s = min(wait_s, MEMORY_CHECK_S)
        ready = wait(list(busy), wait_s if timeout is None else min(wait_s, timeout))
        now = time.monotonic()
        replies = {}
        for conn, w in busy.items():
            rss = self._rss_mb(w)
            if rss > self.config.max_worker_rss_mb > 0:
                too_big = (
                    f"worker exceeded its memory limit ({rss:.0f} MiB resident > "
                    f"{self.config.max_worker_rss_mb:g} MiB)"
                )
                replies.update(self._settle(w, _Failure(too_big, True)))
            elif conn in ready:
                replies.update(self._settle(w, self._receive(w)))
            elif self._sent[w].deadline <= now:
                timed_out = f"worker timed out after {self.config.request_timeout_s} s"
                replies.update(self._settle(w, _Failure(timed_out, True)))
        return replies

    def _rss_mb(self, w: int) -> float:
        """Worker w's resident memory in MiB (0 without a limit, off Linux, or once it is gone)."""
        if not self.config.max_worker_rss_mb:
            return 0.0
        try:
            with open(f"/proc/{self._workers[w][0].pid}/statm") as f:
                pages = int(f.read().split()[1])
        except (OSError, ValueError, IndexError):
            return 0.0
        return pages * os.sysconf("SC_PAGE_SIZE") / 2**20

    def _receive(self, w: int) -> object:
        """Worker w's reply, which has arrived; a _Failure if the worker died instead."""
        process, conn = self._workers[w]
        try:
            return conn.recv()
        except (EOFError, OSError):
            return _crashed(process)

    def _settle(self, w: int, reply: object) -> dict[int, object]:
        """Closes worker w's request with its reply and sends the worker its next steps. A
        _Failure replaces the worker and is the reply of the request's episodes and of the
        steps queued behind it, which are dropped unsent."""
        request, self._sent[w] = self._sent[w], None
        if isinstance(reply, _Failure):
            episodes = request.episodes + [b for b, _ in self._queues[w]]
            self._queues[w].clear()
            self._fail_worker(w, reply.reason)
            return dict.fromkeys(episodes, reply)
        self._dispatch(w)
        return reply

    def _take_steps(self, replies: dict[int, object]) -> None:
        """Records the replies to steps and adds them to the finished steps."""
        for b, reply in replies.items():
            observation = []
            if isinstance(reply, _Failure):
                self._failures.setdefault(b, reply.reason)
                self._dones[b] = True
            else:
                observation, done, result = reply
                self._dones[b] |= done  # Stays True for an episode stopped while in flight.
                if result is not None:
                    self._results[b] = result
            self._finished.append((b, observation, bool(self._dones[b])))

    def _fail_worker(self, w: int, reason: str) -> None:
        """Kills worker w, starts a fresh one, and fails every unfinished episode it held.

        Episodes with a step on their way are reported by that step; the others that the
        caller does not know to be done are remembered, for `submit` to report."""
        process, conn = self._workers[w]
        process.kill()
        process.join()
        conn.close()
        self._workers[w] = self._spawn()
        self._await_ready(*self._workers[w])
        on_the_way = self._pending - {b for b, _, _ in self._finished}
        for b in range(w, len(self._task_ids), len(self._workers)):
            if b in self._results:
                continue
            if not self._dones[b] and b not in on_the_way:
                self._lost.add(b)
            self._failures.setdefault(b, reason)
            self._dones[b] = True
