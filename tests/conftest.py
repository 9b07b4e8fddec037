"""Shared fixtures: tiny Hugging Face checkpoints built once per test session, and one
compilation cache for the run.py processes the tests start."""

from __future__ import annotations

import os

from tests.devices import TEST_XLA_FLAGS

# Before anything imports jax: XLA reads its flags once, when its first backend starts.
os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {TEST_XLA_FLAGS}".strip()

import pytest  # noqa: E402

from tests import hf_models  # noqa: E402


@pytest.fixture(scope="session", autouse=True)
def _compilation_cache(tmp_path_factory):
    """The run.py processes tests start share one compilation cache for the session, in its
    temporary directory rather than the user's ~/.cache (kept if the caller set one). Under
    pytest-xdist the workers share it too: both start run.py on the same configs."""
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent  # the session's directory, above each worker's own
    with pytest.MonkeyPatch.context() as env:
        if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
            env.setenv("JAX_COMPILATION_CACHE_DIR", str(base / "xla"))
            env.setenv("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
        yield


@pytest.fixture(scope="session")
def tiny_checkpoints(tmp_path_factory):
    """{variant: (directory, torch model)} for every variant in hf_models.VARIANTS."""
    out = {}
    for i, variant in enumerate(hf_models.VARIANTS):
        path = str(tmp_path_factory.mktemp(variant))
        out[variant] = (path, hf_models.build_tiny_checkpoint(path, variant, seed=i))
    return out


@pytest.fixture(scope="session")
def suite_model(tmp_path_factory):
    """A tiny random Qwen2 checkpoint with the suite's tokenizer (vocabulary and chat format)."""
    path = str(tmp_path_factory.mktemp("suite_model"))
    return hf_models.with_suite_tokenizer(
        path, lambda p, **kw: hf_models.build_tiny_checkpoint(p, "qwen2_tied", **kw)
    )
