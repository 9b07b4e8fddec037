"""Runs a test body in a fresh Python process with N simulated CPU devices, now or in the
background beside the in-process tests.

XLA fixes the device count when jax is first imported, and pytest imports jax once for all tests,
so multi-device checks run in a subprocess. A subprocess keeps about one core busy; on a 2-core
machine one of them can run beside the tests, so the module-level pool runs one at a time
(one pool per pytest-xdist worker: `make test` runs two).
"""

from __future__ import annotations

import concurrent.futures
import os
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Every program the tests compile (in pytest and in the processes it starts) skips LLVM's
# optimisations and the verification of XLA:CPU's emitted IR: the same HLO passes, fusions and
# buffer assignment as a user's run, and less CPU for the suite, over half of which is compiling
# (BUILD.md gives the measured figures).
TEST_XLA_FLAGS = (
    "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true "
    "--xla_cpu_emitter_verification_level=0"
)
# The run.py processes that train and evaluate and the documented commands (`cpu_env`'s
# default) also emit fusions with XLA:CPU's classic emitters: a third less CPU for a tiny
# model's run, most of which is compiling. What they check does not depend on how XLA:CPU emits
# a fusion (a resume bit for bit, hosts that agree, clear errors, the files a run writes);
# properties of compiled programs (memory, collectives, in-place updates) are checked with
# TEST_XLA_FLAGS.
RUN_XLA_FLAGS = f"{TEST_XLA_FLAGS} --xla_cpu_use_fusion_emitters=false"
# A run whose steps are dominated by executing its programs (a tiny model with Qwen's or
# Llama 3's vocabulary, 151,936 or 128,256 tokens: log-softmaxes over thousands of positions)
# compiles as a user's does: LLVM's optimisations save more than they cost there.
EXECUTION_BOUND_XLA_FLAGS = ""


def cpu_env(num_devices: int = 1, xla_flags: str = RUN_XLA_FLAGS) -> dict[str, str]:
    """This process's environment for a child on `num_devices` simulated CPU devices, compiling
    with `xla_flags` (and the session's compilation cache, tests/conftest.py)."""
    env = dict(os.environ)
    env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={num_devices} {xla_flags}".strip()
    env["JAX_PLATFORMS"] = "cpu"
    return env


_BACKGROUND = concurrent.futures.ThreadPoolExecutor(max_workers=1)


def run_with_devices(code: str, num_devices: int = 8, timeout: int = 600) -> str:
    """Executes `code` with `num_devices` CPU devices; returns stdout, fails loudly on error."""
    env = cpu_env(num_devices, TEST_XLA_FLAGS)
    env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if proc.returncode:
        raise AssertionError(f"subprocess failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    return proc.stdout


def in_background(fn: Callable[..., Any], *args: Any) -> concurrent.futures.Future:
    """Starts fn(*args) in the shared background thread (after the jobs started before it);
    the future's `result()` waits for it and raises what it raised."""
    return _BACKGROUND.submit(fn, *args)


def selected(request: pytest.FixtureRequest, test: Callable[..., Any]) -> bool:
    """Whether `test` (a test function of the requesting module) is among the session's tests,
    so a module fixture starts its background work only when a test will read it."""
    return any(
        getattr(item, "module", None) is request.module and item.originalname == test.__name__
        for item in request.session.items
    )
