"""What each `run.py --mode` does, given a validated config and a work directory.

* train: SEAL training in the work directory (resumes from its newest checkpoint).
* eval: greedy evaluation on the evaluation split with the plain interface; evaluates the work
  directory's newest checkpoint if there is one, else the Hugging Face model at model.path.
  Writes `eval_step<N>.json`.
* export: writes the newest checkpoint's parameters as a Hugging Face directory
  (`<workdir>/export`, tokenizer files copied from model.path).
"""

from __future__ import annotations

import json
import os
from typing import Any

import jax
from absl import logging

from seal_jax import config as config_lib
from seal_jax import sharding
from seal_jax.checkpointing import Checkpointer
from seal_jax.models import CheckpointError, LoadedModel, load_hf_checkpoint, save_hf_checkpoint


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
    n = sum(x.size for x in jax.tree.leaves(model.params))
    logging.info("loaded %s: %.2fM parameters on mesh %s", path, n / 1e6, dict(mesh.shape))
    return model


def _trained_params(model: LoadedModel, workdir: str) -> tuple[Any, int | None]:
    """The newest checkpoint's parameters in workdir (and its step), or the loaded model's."""
    checkpointer = Checkpointer(workdir)
    step = checkpointer.latest_step()
    if step is None:
        return model.params, None
    params, _ = checkpointer.restore_params(step, model.params)
    checkpointer.close()
    return params, step


def run(mode: str, config: Any, workdir: str) -> None:
    """Runs `mode` ('train', 'eval' or 'export')."""
    from seal_jax import distributed, trainer

    if config.distributed.enabled:
        distributed.initialize(config.distributed)
    model = load_policy(config)
    if mode == "train":
        trainer.train(config, model, workdir)
    elif mode == "eval":
        params, step = _trained_params(model, workdir)
        run_ = trainer.build(config, model, workdir)
        metrics = trainer.evaluate(run_, params, step or 0)
        name = f"eval_step{step}.json" if step is not None else "eval_hf.json"
        if jax.process_index() == 0:
            with open(os.path.join(workdir, name), "w") as f:
                json.dump(metrics, f, indent=2)
        logging.info("wrote %s", os.path.join(workdir, name))
    elif mode == "export":
        params, step = _trained_params(model, workdir)
        if step is None:
            raise CheckpointError(f"no training checkpoint in {workdir!r} to export")
        out = os.path.join(workdir, "export")
        save_hf_checkpoint(out, params, model.config, tokenizer_dir=model.path)
        logging.info("exported step %d to %s", step, out)
