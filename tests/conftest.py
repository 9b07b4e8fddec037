"""Shared fixtures: tiny Hugging Face checkpoints built once per test session."""

from __future__ import annotations

import pytest

from tests import hf_models


@pytest.fixture(scope="session")
def tiny_checkpoints(tmp_path_factory):
    """{variant: (directory, torch model)} for every variant in hf_models.VARIANTS."""
    out = {}
    for i, variant in enumerate(hf_models.VARIANTS):
        path = str(tmp_path_factory.mktemp(variant))
        out[variant] = (path, hf_models.build_tiny_checkpoint(path, variant, seed=i))
    return out
