"""Faults injected into run.py training (tests/fault_run.py): SIGTERM in a step's rollout and in
its update, a second signal, a checkpoint that does not read back, a killed and a hung
environment worker. Each interrupted run must lose no completed step, say what it saved, and
continue to the uninterrupted run's state bit for bit.

One uninterrupted 3-step run is the reference; one work directory goes through the signals in
turn (each rerun of the same command continues it), so the last rerun's state compares with the
reference after all of them."""

import json
import os
import shutil
import signal
import subprocess
import sys

import pytest

from seal_jax import preemption
from seal_jax.metrics import read_jsonl
from tests.devices import REPO, cpu_env
from tests.test_trainer import SUITE_ARGS, _assert_same_state, _checkpoint


def _cmd(model, workdir, faults=None, *extra):
    program = ["-m", "tests.fault_run", faults] if faults else ["run.py"]
    flags = [f"--config.model.path={model}", f"--workdir={workdir}", "--config.train.max_steps=3"]
    return [sys.executable, *program, *SUITE_ARGS, *flags, *extra]


def _run(cmd, code=0):
    """Runs a command; asserts its exit code; returns its stderr."""
    proc = subprocess.run(cmd, cwd=REPO, env=cpu_env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == code, proc.stderr[-3000:]
    return proc.stderr


def _steps(workdir):
    return sorted(int(d) for d in os.listdir(workdir / "checkpoints") if d.isdigit())


@pytest.fixture(scope="module")
def reference(suite_model, tmp_path_factory):
    """The work directory of an uninterrupted 3-step run."""
    workdir = tmp_path_factory.mktemp("reference") / "wd"
    _run(_cmd(suite_model, workdir))
    return workdir


def _stopped_line(log):
    lines = [line for line in log.splitlines() if "stopped by" in line]
    assert len(lines) == 1, log[-3000:]
    return lines[0]


def test_signals_lose_no_completed_step_and_resume_bit_for_bit(suite_model, reference, tmp_path):
    workdir = tmp_path / "wd"
    # SIGTERM in step 2's rollout: step 2 is abandoned, checkpoint 1 is what is kept.
    log = _run(_cmd(suite_model, workdir, "sigterm_rollout:2"), preemption.EXIT_CODE)
    line = _stopped_line(log)
    assert "SIGTERM at step 1 (the step in flight was abandoned): checkpoint 1 saved" in line
    assert _steps(workdir) == [1]

    # SIGTERM in step 3's update, after the rerun has done step 2.
    log = _run(_cmd(suite_model, workdir, "sigterm_update:3"), preemption.EXIT_CODE)
    assert "resumed from" in log and "at step 1" in log
    assert "at step 2 (the step in flight was abandoned): checkpoint 2 saved" in _stopped_line(log)
    assert _steps(workdir) == [1, 2]

    # A second signal exits at once (128 + SIGINT), the environment worker killed with it.
    log = _run(_cmd(suite_model, workdir, "double_signal:3"), 128 + signal.SIGINT)
    assert "second signal (SIGINT): exiting at once" in log
    assert _steps(workdir) == [1, 2]

    _run(_cmd(suite_model, workdir))  # the same command again finishes the run
    _assert_same_state(_checkpoint(reference, 3), _checkpoint(workdir, 3))
    # One record per step: those of the abandoned steps were dropped on resume.
    assert [r["step"] for r in read_jsonl(str(workdir / "metrics.jsonl"))] == [1, 2, 3]
    records = read_jsonl(str(reference / "metrics.jsonl"))
    assert all(r["time"]["checkpoint_blocking_s"] > 0 for r in records)  # each save's own


def test_an_unreadable_latest_checkpoint_falls_back_to_the_one_before(
    suite_model, reference, tmp_path
):
    """A bad JSON part in checkpoint 3 (the other kinds of damage: tests/test_checkpointing.py):
    eval says it used step 2 and keeps 3; training restores 2, reports 3 in one line, runs
    step 3 again and ends where the uninterrupted run did."""
    workdir = tmp_path / "wd"
    shutil.copytree(reference, workdir)
    (workdir / "checkpoints" / "3" / "host" / "metadata").write_text('{"step": 3')
    limit = ["--config.train.eval_limit=2", "--config.train.eval_batch_tasks=2"]
    log = _run(_cmd(suite_model, workdir, None, "--mode=eval", *limit))
    assert "checkpoint 3 does not read back" in log and "3 kept" in log
    assert "using checkpoint 2 of" in log
    assert json.loads((workdir / "eval_step2.json").read_text())["num_tasks"] == 2
    log = _run(_cmd(suite_model, workdir))
    warnings = [line for line in log.splitlines() if "does not read back" in line]
    assert len(warnings) == 1 and "restored step 2" in warnings[0], log[-3000:]
    assert "at step 2" in log.split("resumed from", 1)[1].splitlines()[0]
    _assert_same_state(_checkpoint(reference, 3), _checkpoint(workdir, 3))


def test_a_killed_and_a_hung_worker_fail_only_their_episodes(suite_model, tmp_path):
    workdir = tmp_path / "wd"
    faults = "kill_worker:2,stop_worker:3"
    extra = ("--config.env.num_workers=2", "--config.env.worker_timeout_s=2")
    _run(_cmd(suite_model, workdir, faults, *extra))
    assert _steps(workdir) == [1, 2, 3]  # every step completed
    records = read_jsonl(str(workdir / "metrics.jsonl"))
    faults = [r["rollout"]["env_faults"] for r in records]
    assert faults[0] == {k: 0 for k in faults[0]}
    # Worker 0 held episodes 0 and 2 of the 4; the others finished as usual.
    assert faults[1]["worker_crashed"] == 2 and sum(faults[1].values()) == 2
    assert faults[2]["worker_timed_out"] == 2 and sum(faults[2].values()) == 2


def test_a_signal_is_only_recorded_until_an_abandonable_block_checks_it():
    """In one process: the handler records SIGTERM and nothing else; `check` raises only inside
    an `abandonable` block (also one entered later); the previous handler comes back after."""
    before = signal.getsignal(signal.SIGTERM)
    with preemption.handling():
        assert not preemption.requested()
        os.kill(os.getpid(), signal.SIGTERM)
        assert preemption.requested() and preemption.agreed()
        preemption.check()  # outside a block: nothing
        with pytest.raises(preemption.Preempted, match="abandoned"), preemption.abandonable():
            pass  # entering the block checks at once
        with pytest.raises(preemption.Preempted):
            preemption.host_local(lambda: None)  # one process: the stop propagates
        preemption.raise_if_abandoned([None])
        with pytest.raises(preemption.Preempted, match="host 1 abandoned"):
            preemption.raise_if_abandoned([None, preemption.ABANDONED])
    assert signal.getsignal(signal.SIGTERM) is before
