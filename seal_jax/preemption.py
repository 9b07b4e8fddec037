"""Stopping on a preemption notice: what SIGTERM (a spot or preemptible TPU VM's notice, about
30 s before the machine goes) and SIGINT do to a training run.

First signal: the run stops at the next safe point. Inside an `abandonable` block (a training
step's rollout and, on one host, its update: code that changes nothing a checkpoint holds) that
is the next `check` (each decode segment of the rollout, each micro-step of the update), which
abandons the step in flight; anywhere else the step in flight finishes. The handler itself only
records the signal: the stop happens at those points, never inside whatever code the signal
interrupted. The trainer then saves the last completed step, closes the environment pool and
raises `Preempted`, which `run.py` turns into one log line and exit code EXIT_CODE: rerunning
the same command continues from that checkpoint, bit for bit.

Second signal: exit at once with 128 + the signal number, from a watcher thread (so even while
the main thread waits on a device computation), killing the environment workers first. A
checkpoint being written is then left as orbax's temporary directory, which restarts ignore:
the previous complete checkpoints stay as they were.

Several hosts: on TPU the notice is the same SIGTERM (jax's preemption service listens for it;
the handlers here take it over, so that a step can also be abandoned and a second signal obeyed).
Hosts agree on where to stop as `multihost_utils.reached_preemption_sync_point` makes them agree:
every host calls `agreed` at the end of each step (one all-gather of a flag per host), so all
stop after the same step; and a host that abandons its rollout says so in the step's episode
all-gather (`host_local`, `raise_if_abandoned`), so that every host abandons that step. The
update runs collective programs with the other hosts, so there it is never abandoned.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

import numpy as np
from absl import logging

from seal_jax import distributed

EXIT_CODE = 75  # EX_TEMPFAIL: stopped on request with the last completed step saved; rerun it
SIGNALS = (signal.SIGTERM, signal.SIGINT)
ABANDONED = "abandoned"  # what a host that abandoned its rollout contributes to the gather

T = TypeVar("T")


class Preempted(Exception):  # noqa: N818  (a request, not an error)
    """The run was asked to stop (a signal here or on another host); `message` says what was
    saved once the trainer has saved it."""


class _Stop:
    """The process's stop request: set by the first signal, read by the trainer."""

    def __init__(self) -> None:
        self.signal: str | None = None  # the first signal's name, once one came
        self.abandonable = 0  # depth of `abandonable` blocks the main thread is in
        self.installed = False


_STOP = _Stop()


def requested() -> bool:
    """Whether this process has received a stop signal."""
    return _STOP.signal is not None


def _on_signal(signum: int, frame: object) -> None:
    """The main thread's handler: records the first signal (the watcher thread acts on the
    second)."""
    if _STOP.signal is None:
        _STOP.signal = signal.Signals(signum).name


def _watch(read_fd: int) -> None:
    """Reads the signal numbers Python writes to its wakeup fd: logs the first, and on the
    second kills the environment workers and exits the process at once."""
    count = 0
    while data := os.read(read_fd, 1):
        if data[0] not in SIGNALS:  # another signal with a Python handler (e.g. SIGALRM)
            continue
        count += 1
        name = signal.Signals(data[0]).name
        if count == 1:
            logging.warning(
                "%s: stopping at the next safe point, then saving the last completed step "
                "(send it again to exit at once)",
                name,
            )
            continue
        logging.warning("second signal (%s): exiting at once", name)
        for child in multiprocessing.active_children():
            child.kill()
        os._exit(128 + data[0])


@contextlib.contextmanager
def handling() -> Iterator[None]:
    """Installs the SIGTERM and SIGINT handlers and restores the previous ones on exit; a
    signal before this or after it keeps its default effect. Off the main thread (where Python
    cannot handle signals) it installs nothing, and signals keep their effect throughout."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: signal.signal(s, _on_signal) for s in SIGNALS}
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    previous_fd = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
    watcher = threading.Thread(target=_watch, args=(read_fd,), name="preemption", daemon=True)
    watcher.start()
    _STOP.signal, _STOP.abandonable, _STOP.installed = None, 0, True
    try:
        yield
    finally:
        _STOP.installed = False
        signal.set_wakeup_fd(previous_fd)
        for s, handler in previous.items():  # None: set outside Python (e.g. jax's own)
            signal.signal(s, signal.SIG_DFL if handler is None else handler)
        os.close(write_fd)  # the watcher reads end-of-file and returns
        watcher.join()
        os.close(read_fd)


@contextlib.contextmanager
def abandonable(collective: bool = False) -> Iterator[None]:
    """A block that a stop signal may abandon midway (`check` raises `Preempted` in it): the
    caller promises that nothing a checkpoint holds changes inside. `collective`: the block
    runs programs together with other processes, which a process cannot leave alone, so with
    several processes it is not abandoned (the stop waits for the step's end)."""
    if not _STOP.installed or (collective and distributed.multi_process()):
        yield
        return
    _STOP.abandonable += 1
    try:
        check()
        yield
    finally:
        _STOP.abandonable -= 1


def check() -> None:
    """Raises `Preempted` inside an `abandonable` block once a stop signal came; elsewhere does
    nothing. The rollout and the update call it between their device programs."""
    if _STOP.abandonable and requested():
        raise Preempted("the step in flight was abandoned")


def host_local(run: Callable[[], T]) -> T | str:
    """run() as an `abandonable` block of this host's own work. Abandoned with one process,
    `Preempted` propagates; with several, ABANDONED comes back instead, for the caller's next
    all-gather to tell every host (`raise_if_abandoned`)."""
    try:
        with abandonable():
            result = run()
            check()  # a signal during the rollout's last environment step abandons it too
            return result
    except Preempted:
        if not distributed.multi_process():
            raise
        return ABANDONED


def raise_if_abandoned(gathered: Sequence[Any]) -> None:
    """Raises `Preempted` on every host when one host abandoned its share (`host_local`)."""
    hosts = [p for p, item in enumerate(gathered) if isinstance(item, str) and item == ABANDONED]
    if hosts:
        raise Preempted(f"host {hosts[0]} abandoned the step in flight")


def agreed() -> bool:
    """Whether any process has received a stop signal; with several processes every one must
    call this at the same point (an all-gather), and all get the same answer."""
    flag = np.array([requested()], np.int32)
    if not distributed.multi_process():
        return bool(flag[0])
    from jax.experimental import multihost_utils

    return bool(np.asarray(multihost_utils.process_allgather(flag)).any())


def signal_name() -> str:
    """The first stop signal's name, or "another host's stop signal"."""
    return _STOP.signal or "another host's stop signal"
