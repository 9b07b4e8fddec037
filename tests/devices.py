"""Runs a test body in a fresh Python process with N simulated CPU devices.

XLA fixes the device count when jax is first imported, and pytest imports jax once for all tests,
so multi-device checks run in a subprocess.
"""

from __future__ import annotations

import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_with_devices(code: str, num_devices: int = 8, timeout: int = 600) -> str:
    """Executes `code` with `num_devices` CPU devices; returns stdout, fails loudly on error."""
    env = dict(os.environ)
    env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={num_devices}"
    env["JAX_PLATFORMS"] = "cpu"
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
