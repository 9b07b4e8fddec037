"""What each `run.py --mode` does, given a validated config and a work directory."""

from __future__ import annotations

import os
from typing import Any

from absl import logging

from seal_jax import config as config_lib
from seal_jax import sharding
from seal_jax.models import CheckpointError, LoadedModel, load_hf_checkpoint


def load_policy(config: Any) -> LoadedModel:
    """Loads `config.model.path` onto the config's mesh with the config's dtypes."""
    path = config.model.path
    if not path:
        raise CheckpointError("no checkpoint given: set --config.model.path=/path/to/hf_model_dir")
    mesh = sharding.mesh_from_config(config.mesh)
    model = load_hf_checkpoint(
        os.path.expanduser(path),
        mesh=mesh,
        dtype=config_lib.dtype(config.model.param_dtype),
        compute_dtype=config_lib.dtype(config.model.compute_dtype),
    )
    n = sum(x.size for x in __import__("jax").tree.leaves(model.params))
    logging.info("loaded %s: %.2fM parameters on mesh %s", path, n / 1e6, dict(mesh.shape))
    return model


def run(mode: str, config: Any, workdir: str) -> None:
    """Runs `mode` ('train', 'eval' or 'export')."""
    load_policy(config)
    raise config_lib.ConfigError(
        f"--mode={mode} is not available yet: the co-evolution trainer, evaluation and export "
        "land with issue 7; this build loads and validates the policy checkpoint only"
    )
