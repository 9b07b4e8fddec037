"""End to end: SEAL training steps through run.py, exact resume after SIGKILL, 8 devices, two
hosts (one of them sent SIGTERM), and clear errors for bad work directories.

Every test here runs run.py processes, each keeping one core busy (compiling, then stepping).
The runs that depend on nothing else in the module (the BFCL runs, the 8-device comparison) go
in the background when the module starts, one at a time beside the tests, which wait only for
the runs they read; the tests that read the shared 2-step run come first meanwhile."""

import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import time

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

from seal_jax.metrics import flatten_scalars, read_jsonl
from seal_jax.models import load_hf_checkpoint
from tests import hf_models
from tests.devices import EXECUTION_BOUND_XLA_FLAGS, REPO, cpu_env, in_background, selected

SUITE_ARGS = [
    "--config=configs/tiny_test.py",
    "--config.env.name=suite",
    "--config.train.batch_tasks=2",
    "--config.rl.group_size=2",
    "--config.train.mini_batch_tasks=1",
    "--config.rollout.max_new_tokens=12",
    "--config.train.eval_max_new_tokens=12",
    "--config.rollout.context_limit=1024",
    "--config.model.logprob_chunk=64",
    "--config.train.length_bucket=256",  # one bucket for the prompts, one for the replies
    "--config.train.eval_every=0",
    "--config.env.num_workers=1",
    "--config.interface.error_hints=adaptive",
    "--config.interface.guidelines=adaptive",
    "--config.weighting.cause_utilities=True",
]


def _command(model, workdir, *extra):
    return [
        sys.executable,
        "run.py",
        *SUITE_ARGS,
        f"--config.model.path={model}",
        f"--workdir={workdir}",
        *extra,
    ]


def _run(cmd, env, timeout=600):
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stderr


def _checkpoint(workdir, step):
    """(params, opt_state, host) of a checkpoint, restored onto this process's first device."""
    base = os.path.join(workdir, "checkpoints", str(step))
    checkpointer = ocp.StandardCheckpointer()
    device = jax.sharding.SingleDeviceSharding(jax.devices()[0])

    def load(item):
        tree = checkpointer.metadata(os.path.join(base, item)).item_metadata.tree
        target = jax.tree.map(
            lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=device), tree
        )
        restored = checkpointer.restore(os.path.join(base, item), target)
        return {k: np.asarray(v) for k, v in _flatten(restored)}

    with open(os.path.join(base, "host", "metadata")) as f:
        host = json.load(f)
    return load("params"), load("opt_state"), host


def _flatten(tree, prefix=""):
    if isinstance(tree, dict):
        for k, v in tree.items():
            yield from _flatten(v, f"{prefix}/{k}")
    elif isinstance(tree, (list, tuple)):
        for i, v in enumerate(tree):
            yield from _flatten(v, f"{prefix}/{i}")
    elif tree is not None:
        yield prefix, tree


def _assert_same_state(a, b, exact=True):
    params_a, opt_a, host_a = a
    params_b, opt_b, host_b = b
    assert params_a.keys() == params_b.keys() and opt_a.keys() == opt_b.keys()
    for tree_a, tree_b in ((params_a, params_b), (opt_a, opt_b)):
        for k in tree_a:
            if exact:
                np.testing.assert_array_equal(tree_a[k], tree_b[k], err_msg=k)
            else:
                # Adam divides by sqrt(v): for near-zero gradients float32 reduction-order noise
                # moves a parameter by up to a few % of the step size lr = 1e-3.
                np.testing.assert_allclose(tree_a[k], tree_b[k], rtol=1e-4, atol=5e-5, err_msg=k)
    for key in ("step", "weighting", "interface"):
        assert host_a[key] == host_b[key], key


def _kill_after_checkpoint(cmd, env, workdir, step):
    """Starts training, SIGKILLs it once checkpoint `step` is complete, returns."""
    proc = subprocess.Popen(
        cmd, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    done = os.path.join(workdir, "checkpoints", str(step))
    deadline = time.time() + 600
    while not os.path.isdir(done) and proc.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()


@pytest.fixture(scope="module", autouse=True)
def background(request, suite_model, tmp_path_factory):
    """{name: future} of the independent runs of the selected tests (see the docstring)."""
    jobs = {}
    if selected(request, test_bfcl_fresh_process_on_a_copy_reproduces_the_second_step):
        model = request.getfixturevalue("qwen3_model")
        jobs["bfcl"] = in_background(_bfcl_runs, model, tmp_path_factory.mktemp("bfcl"))
    if selected(request, test_eight_devices_sharing_prompts_match_one_without):
        base = tmp_path_factory.mktemp("8")
        jobs["eight_devices"] = in_background(_eight_device_runs, suite_model, base)
    yield jobs
    for job in jobs.values():
        job.cancel()


@pytest.fixture(scope="module")
def two_steps(suite_model, tmp_path_factory):
    """The work directory of an uninterrupted 2-step run: the tests below read it or copy it."""
    workdir = tmp_path_factory.mktemp("two_steps") / "wd"
    _run(_command(suite_model, workdir, "--config.train.max_steps=2"), cpu_env())
    return workdir


def _metrics(workdir):
    return read_jsonl(str(workdir / "metrics.jsonl"))


def _tensorboard_scalars(workdir):
    """{tag: {step: value}} of the work directory's TensorBoard event files (TFRecord framing:
    length, its CRC, an Event proto, its CRC; tensorboardX's protos decode them)."""
    from tensorboardX.proto.event_pb2 import Event

    scalars = {}
    for name in os.listdir(workdir / "tensorboard"):
        data = (workdir / "tensorboard" / name).read_bytes()
        while data:
            (length,) = struct.unpack("<Q", data[:8])
            event = Event.FromString(data[12 : 12 + length])
            data = data[16 + length :]
            for value in event.summary.value:
                scalars.setdefault(value.tag, {})[event.step] = value.simple_value
    return scalars


def test_resume_after_sigkill_reproduces_the_uninterrupted_run(suite_model, two_steps, tmp_path):
    metrics = _metrics(two_steps)
    assert [m["step"] for m in metrics] == [1, 2]
    assert {"rollout", "weights", "utilities", "interface", "loss", "time"} <= metrics[-1].keys()
    # TensorBoard holds every numeric metric of each step (its float32 rounding of it).
    logged = [
        (r["step"], {k: v for k, v in flatten_scalars(r).items() if k not in ("step", "wall_time")})
        for r in metrics
    ]
    scalars = _tensorboard_scalars(two_steps)
    assert scalars.keys() == {tag for _, record in logged for tag in record}
    for step, record in logged:
        for tag, value in record.items():
            assert scalars[tag][step] == pytest.approx(value, rel=1e-6, abs=1e-30), tag

    env, resumed = cpu_env(), tmp_path / "resumed"
    cmd = _command(suite_model, resumed, "--config.train.max_steps=2")
    _kill_after_checkpoint(cmd, env, resumed, step=1)
    log = _run(cmd, env)  # the same command again resumes
    assert "resumed from" in log
    _assert_same_state(_checkpoint(two_steps, 2), _checkpoint(resumed, 2))


@pytest.fixture(scope="module")
def qwen3_model(tmp_path_factory):
    """A tiny random Qwen3 checkpoint with the real Qwen tokenizer (vocab 151,936)."""
    path = str(tmp_path_factory.mktemp("qwen3_model"))
    hf_models.build_tiny_checkpoint(path, "qwen3", vocab_size=151936, eos_token_id=151645)
    for f in ("tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt"):
        shutil.copy(os.path.join(hf_models.qwen_tokenizer_dir(), f), path)
    return path


def _assert_export_is_checkpoint(workdir, step):
    """The work directory's export/ holds checkpoint `step`'s parameters (exported as bfloat16)."""
    exported = load_hf_checkpoint(str(workdir / "export"))
    trained, _, _ = _checkpoint(workdir, step)
    for path, value in _flatten(exported.params):
        np.testing.assert_allclose(
            np.asarray(value), trained[path], rtol=0, atol=1e-2, err_msg=path
        )


def test_eval_and_export_modes(suite_model, two_steps, tmp_path):
    env = cpu_env()
    limit = ["--config.train.eval_limit=8", "--config.train.eval_batch_tasks=8"]
    fresh = tmp_path / "fresh"
    _run(_command(suite_model, fresh, "--mode=eval", *limit), env)
    report = json.loads((fresh / "eval_hf.json").read_text())
    assert report["num_tasks"] == 8 and len(report["accuracy"]) == 4  # round-robin categories
    assert report["strict_accuracy"].keys() == report["accuracy"].keys()
    assert all(report["strict_accuracy"][c] <= report["accuracy"][c] for c in report["accuracy"])
    # Every episode is written out, and its verdicts are the ones the report counts.
    episodes = read_jsonl(str(fresh / "eval_transcripts" / "step0_official.jsonl"))
    assert len(episodes) == 8 and all(e["transcript"][0]["role"] == "system" for e in episodes)
    for category, accuracy in report["accuracy"].items():
        mine = [e["success"] for e in episodes if e["category"] == category]
        assert accuracy == pytest.approx(sum(mine) / len(mine)), category

    workdir = tmp_path / "trained"
    shutil.copytree(two_steps, workdir)
    _run(_command(suite_model, workdir, "--mode=export"), env)
    _assert_export_is_checkpoint(workdir, 2)
    assert os.path.isfile(workdir / "export" / "tokenizer.json")
    _run(_command(suite_model, workdir, "--mode=eval", *limit), env)
    assert json.loads((workdir / "eval_step2.json").read_text())["num_tasks"] == 8


def test_sampler_old_logprobs_skip_the_recompute(suite_model, two_steps, tmp_path):
    """rl.old_logprobs=sampler takes the PPO ratio's denominator from the engine: the same
    rollouts as the recomputing run's first step, no recompute gap logged, and ratios at 1 (a
    misaligned or tempered log-prob would put them far off; the recompute's own agreement is
    checked against the logged gap)."""
    sampler = tmp_path / "sampler"
    args = ["--config.train.max_steps=1", "--config.rl.old_logprobs=sampler"]
    _run(_command(suite_model, sampler, *args), cpu_env())
    step = {"recompute": _metrics(two_steps)[0], "sampler": _metrics(sampler)[-1]}
    assert step["recompute"]["logprob_gap_sampler_vs_recomputed"] < 1e-4
    assert "logprob_gap_sampler_vs_recomputed" not in step["sampler"]
    assert step["sampler"]["rollout"] == step["recompute"]["rollout"]  # same rollouts
    for name in ("recompute", "sampler"):
        loss = step[name]["loss"]
        assert 0.99 < loss["ratio_min"] <= loss["ratio_max"] < 1.01, (name, loss)


def _error_line(cmd, env):
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert proc.returncode == 2 and len(errors) == 1, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    return errors[0]


def test_bad_work_directories_fail_with_one_clear_line(suite_model, two_steps, tmp_path):
    env = cpu_env()
    a_file = tmp_path / "file"
    a_file.write_text("x")
    assert "Not a directory" in _error_line(_command(suite_model, a_file / "wd"), env)

    foreign = tmp_path / "foreign" / "checkpoints" / "3"
    foreign.mkdir(parents=True)
    (foreign / "weights.bin").write_bytes(b"\0" * 64)
    line = _error_line(_command(suite_model, tmp_path / "foreign"), env)
    assert "not a readable seal_jax training checkpoint" in line

    # A checkpoint written for another model shape.
    other = tmp_path / "other_model"
    shutil.copytree(suite_model, other)
    cfg = json.loads((other / "config.json").read_text())
    cfg["intermediate_size"] = 128
    (other / "config.json").write_text(json.dumps(cfg))
    hf_models.build_tiny_checkpoint(
        str(other),
        "qwen2_tied",
        vocab_size=cfg["vocab_size"],
        intermediate_size=128,
        eos_token_id=cfg["eos_token_id"],
    )
    wd = tmp_path / "shape"
    shutil.copytree(two_steps, wd)
    assert "has shape" in _error_line(_command(other, wd, "--config.train.max_steps=3"), env)


BFCL_ARGS = [
    "--config=configs/tiny_test.py",
    "--config.env.name=bfcl",
    "--config.train.batch_tasks=1",
    "--config.rl.group_size=2",
    "--config.train.mini_batch_tasks=1",
    "--config.rollout.max_new_tokens=8",
    "--config.train.eval_max_new_tokens=8",
    "--config.rollout.context_limit=8192",
    "--config.rollout.min_batch=2",  # the prompt's prefill too: fewer programs
    "--config.rollout.min_prefill_width=64",
    "--config.model.logprob_chunk=1024",
    "--config.train.length_bucket=512",
    "--config.train.eval_every=0",
    "--config.env.num_workers=1",
]


def _only_checkpoint_1(directory, names):
    """copytree's ignore: in a work directory's checkpoints/, every entry but step 1's."""
    return [n for n in names if n != "1"] if os.path.basename(directory) == "checkpoints" else []


def _bfcl_runs(model, base):
    """An uninterrupted 2-step BFCL run and a fresh process on a copy of its work directory as it
    stood after step 1 (its checkpoint 1 and what else was there; keep_checkpoints=3 keeps it),
    trained to step 2. The copy is taken and resumed as soon as checkpoint 1 is complete (saves
    are atomic renames), while the first run goes on. Returns (straight, copy, copy's log)."""
    env = cpu_env(xla_flags=EXECUTION_BOUND_XLA_FLAGS)  # Qwen's vocabulary

    def cmd(workdir, steps):
        return [
            sys.executable,
            "run.py",
            *BFCL_ARGS,
            f"--config.model.path={model}",
            f"--workdir={workdir}",
            f"--config.train.max_steps={steps}",
        ]

    straight, copy = base / "straight", base / "copy"
    with open(base / "straight.log", "w") as log:
        proc = subprocess.Popen(
            cmd(straight, 2), cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=log
        )
        try:
            checkpoints = straight / "checkpoints"
            deadline = time.time() + 600
            while not (checkpoints / "1").is_dir() and proc.poll() is None:
                assert time.time() < deadline, "no checkpoint 1 after 600 s"
                time.sleep(0.05)
            resumed_log = None
            if (checkpoints / "1").is_dir():
                shutil.copytree(straight, copy, ignore=_only_checkpoint_1)
                resumed_log = _run(cmd(copy, 2), env)
            proc.wait(timeout=600)
        finally:
            if proc.poll() is None:
                proc.kill()
    assert proc.returncode == 0, (base / "straight.log").read_text()[-3000:]
    return straight, copy, resumed_log


def test_bfcl_fresh_process_on_a_copy_reproduces_the_second_step(background):
    straight, copy, log = background["bfcl"].result()
    assert "at step 1" in log.split("resumed from", 1)[1].splitlines()[0]
    _assert_same_state(_checkpoint(straight, 2), _checkpoint(copy, 2))
    step = _metrics(straight)[-1]
    assert step["rollout"]["tokens_generated"] > 0
    assert set(step["rollout"]["success"]) <= {"base", "miss_func", "miss_param", "long_context"}


def _eight_device_runs(model, base):
    """One step on one device where every row carries its own prompt, then the same step on 8
    devices (4 data shards, each with one task's prompt and its rows). Returns (one, eight, the
    8-device log)."""
    args = [
        "--config.train.max_steps=1",
        "--config.train.batch_tasks=4",
        "--config.train.mini_batch_tasks=4",
        "--config.rollout.micro_batch_tasks=2",  # the step's rollouts in two engine batches
    ]
    one, eight = base / "one", base / "eight"
    _run(_command(model, one, *args, "--config.train.share_prompt=False"), cpu_env())
    log = _run(
        _command(model, eight, *args, "--config.mesh.data=4", "--config.mesh.tensor=2"),
        cpu_env(8),
    )
    return one, eight, log


def test_eight_devices_sharing_prompts_match_one_without(background):
    """8 devices (4 data shards, each with one task's prompt and its rows) against one device
    where every row carries its own prompt: the same step."""
    one, eight, log = background["eight_devices"].result()
    assert "share_prompt is off" not in log
    _assert_same_state(_checkpoint(one, 1), _checkpoint(eight, 1), exact=False)
    tokens = {}
    for name, workdir in (("one", one), ("eight", eight)):
        step = _metrics(workdir)[-1]
        tokens[name] = step["batch_tokens"]
    assert tokens["eight"] < tokens["one"]  # each prompt ran once for its 2 rows


def _two_processes(model, workdir, faults=None, steps=2):
    """Runs 2 processes of training in workdir (process 1 with `faults`, tests/fault_run.py);
    returns [(exit code, log)] per process."""
    port = 20000 + (os.getpid() + hash(str(workdir))) % 20000
    procs = []
    for pid in range(2):
        program = ["-m", "tests.fault_run", faults] if faults and pid == 1 else ["run.py"]
        cmd = [
            sys.executable,
            *program,
            *SUITE_ARGS,
            f"--config.model.path={model}",
            f"--workdir={workdir}",
            f"--config.train.max_steps={steps}",
            "--config.distributed.enabled=True",
            f"--config.distributed.coordinator_address=127.0.0.1:{port}",
            "--config.distributed.num_processes=2",
            f"--config.distributed.process_id={pid}",
        ]
        procs.append(
            subprocess.Popen(
                cmd,
                cwd=REPO,
                env=cpu_env(),
                text=True,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
            )
        )
    logs = [p.communicate(timeout=600)[1] for p in procs]
    return [(p.returncode, log) for p, log in zip(procs, logs)]


def _checksums(logs):
    return [
        line.rsplit(" ", 1)[-1]
        for log in logs
        for line in log.splitlines()
        if "parameter checksum" in line
    ]


@pytest.fixture(scope="module")
def two_processes(suite_model, tmp_path_factory):
    """An uninterrupted 2-step run of two processes: (work directory, their logs)."""
    workdir = tmp_path_factory.mktemp("mh") / "wd"
    results = _two_processes(suite_model, workdir)
    assert [code for code, _ in results] == [0, 0], "".join(log[-2000:] for _, log in results)
    return workdir, [log for _, log in results]


def test_two_processes_end_with_identical_parameters(two_processes):
    workdir, logs = two_processes
    sums = _checksums(logs)
    assert len(sums) == 2 and sums[0] == sums[1]
    assert os.path.isdir(workdir / "checkpoints" / "2")


def test_sigterm_to_one_of_two_processes_stops_both_at_one_step(
    suite_model, two_processes, tmp_path
):
    """SIGTERM in process 1's rollout of step 2: process 1 abandons its share and says so in
    the episode all-gather, so both abandon step 2, keep checkpoint 1 and exit 75; the same
    commands again end with the uninterrupted run's parameters on both."""
    from seal_jax import preemption

    workdir = tmp_path / "wd"
    results = _two_processes(suite_model, workdir, "sigterm_rollout:2")
    logs = [log for _, log in results]
    assert [code for code, _ in results] == [preemption.EXIT_CODE] * 2, logs[1][-3000:]
    stops = [line for log in logs for line in log.splitlines() if "stopped by" in line]
    assert len(stops) == 2 and all("at step 1" in line for line in stops), stops
    assert "SIGTERM" in stops[1] and "host 1 abandoned the step in flight" in stops[0]
    assert sorted(os.listdir(workdir / "checkpoints")) == ["1"]
    results = _two_processes(suite_model, workdir)
    assert [code for code, _ in results] == [0, 0]
    assert _checksums(log for _, log in results) == _checksums(two_processes[1])
