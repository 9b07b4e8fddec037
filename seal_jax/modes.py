"""What each `run.py --mode` does, given a validated config and a work directory.

* train: SEAL training in the work directory (resumes from its newest checkpoint).
* eval: greedy evaluation on the evaluation split with the plain interface; evaluates the work
  directory's newest checkpoint if there is one, else the Hugging Face model at model.path.
  Writes `eval_step<N>.json`; with `eval.extra_categories`, also BFCL's single-turn and memory
  categories (under "extra", transcripts in `eval_step<N>_extra/`).
* export: writes the newest checkpoint's parameters as a Hugging Face directory
  (`<workdir>/export`, tokenizer files copied from model.path).
* compile: compiles every program of a training step for `aot.topology` (a TPU topology, or this
  host's devices) from model.path's config.json alone, and reports per-chip memory against the
  chip's (`seal_jax.aot.check`): `<workdir>/compile.json`, exit code 2 when a program cannot fit.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import jax
import numpy as np
from absl import logging
from etils import epath

from seal_jax import config as config_lib
from seal_jax import report, sft, sharding
from seal_jax.checkpointing import Checkpointer
from seal_jax.models import (
    CheckpointError,
    LoadedModel,
    load_hf_checkpoint,
    save_hf_checkpoint,
)
from seal_jax.models.config import architecture_from_dir

if TYPE_CHECKING:
    from environments.rendering import Renderer
    from environments.sources import TaskSource


def initial_policy(config: Any, workdir: str) -> str:
    """The Hugging Face directory RL starts from: model.path, or a from-scratch tiny policy
    (model.scratch), then warm-started on oracle transcripts when sft.steps > 0. Both are
    written once into the work directory and reused when a run resumes."""
    path = policy_dir(config, workdir)
    if config.sft.steps > 0:
        warm = os.path.join(workdir, "warm_start")
        if not os.path.isfile(os.path.join(warm, "config.json")):
            _warm_start(config, path, warm)
        path = warm
    return path


def policy_dir(config: Any, workdir: str) -> str:
    """model.path, or the from-scratch tiny policy (model.scratch), written once into the work
    directory. Raises CheckpointError when neither is set."""
    path = config.model.path
    if not path and config.model.scratch.enabled:
        path = os.path.join(workdir, "scratch_policy")
        if not os.path.isfile(os.path.join(path, "config.json")):
            s = config.model.scratch
            sft.make_tiny_policy(
                path,
                hidden=s.hidden,
                layers=s.layers,
                heads=s.heads,
                kv_heads=s.kv_heads,
                intermediate=s.intermediate,
                seed=config.seed,
            )
    if not path:
        raise CheckpointError("no checkpoint given: set --config.model.path=/path/to/hf_model_dir")
    return path


def warm_start_ids(categories: Sequence[str], source: TaskSource) -> list[str]:
    """The training tasks named by `sft.categories`, in split order.

    Args:
      categories: entries "category" (all its training tasks) or "category:N" (its first N);
        empty means every training task.
      source: the environments.sources.TaskSource.
    Raises:
      ConfigError: an unknown category or a count that is not a positive integer.
    """
    ids = source.split_ids("train")
    if not categories:
        return ids
    limits = {}
    for entry in categories:
        name, _, count = str(entry).partition(":")
        if name not in source.categories:
            raise config_lib.ConfigError(
                f"--config.sft.categories: unknown {[name]}; "
                f"the source has {list(source.categories)}"
            )
        if count and not (count.isdigit() and int(count) > 0):
            raise config_lib.ConfigError(
                f"--config.sft.categories: {entry!r} needs a positive task count after ':'"
            )
        limits[name] = int(count) if count else len(ids)
    chosen, seen = [], dict.fromkeys(limits, 0)
    for i in ids:
        category = source.category_of(i)
        if category in limits and seen[category] < limits[category]:
            chosen.append(i)
            seen[category] += 1
    return chosen


def warm_start_views(config: Any) -> list[Renderer]:
    """The interfaces the warm start's oracle transcripts are rendered in: the plain one (what
    evaluation shows) and, when any interface component can be shown in training (static from
    the first step, like the released schema cues, or adaptive, which the closed loop switches
    on unit by unit), the training interface with every unit of those components shown, so that
    RL never meets cue, hint or guideline text the warm start never saw."""
    from environments.interface import COMPONENTS, LearningInterface
    from environments.rendering import Renderer

    plain = Renderer(prompt_style=config.interface.prompt_style)
    shown = [c for c in COMPONENTS if config.interface[c] != "off"]
    if not shown:
        return [plain]
    covered = config.interface.copy_and_resolve_references()
    for component in shown:
        covered[component] = "static"
    return [plain, LearningInterface(covered).renderer()]


def _warm_start(config: Any, path: str, out: str) -> None:
    """Fine-tunes the policy at path on oracle transcripts and saves it to out."""
    from environments.sources import get_source
    from seal_jax.chat import run_chat_format

    model = load_policy(config, path)
    source = get_source(config.env.name, config.env.bfcl_split)
    ids = warm_start_ids(config.sft.categories, source)
    if config.sft.num_tasks:
        order = np.random.default_rng(config.seed).permutation(len(ids))
        ids = [ids[i] for i in sorted(order[: config.sft.num_tasks])]
    chat = run_chat_format(model.tokenizer(), config)
    if chat.tool_format == "toolace":  # the oracle (environments/policies.py) writes JSON calls
        raise config_lib.ConfigError(
            f"--config.sft.steps={config.sft.steps}: the warm start's oracle writes qwen, qwen_xml "
            f"or smollm2 tool calls, not the {chat.tool_format} format of this checkpoint; use "
            "sft.steps=0"
        )
    tasks = [source.load_task(i) for i in ids]
    views = warm_start_views(config)
    transcripts = [t for view in views for t in sft.oracle_transcripts(tasks, chat, view)]
    params = sft.warm_start(
        model.params,
        model.config,
        model.mesh,
        transcripts,
        steps=config.sft.steps,
        batch_size=config.sft.batch_size,
        lr=config.sft.lr,
        warmup_steps=config.sft.warmup_steps,
        seed=config.seed,
        length_bucket=config.sft.length_bucket,
        all_token_steps=round(config.sft.all_token_fraction * config.sft.steps),
        dtype=model.compute_dtype,
        scan_unroll=config.model.scan_unroll,
    )
    save_hf_checkpoint(
        out, params, model.config, dtype=config.model.param_dtype, tokenizer_dir=path
    )
    logging.info("warm start on %d oracle transcripts saved to %s", len(transcripts), out)


def load_policy(config: Any, path: str | None = None) -> LoadedModel:
    """Loads `path` (default `config.model.path`) onto the config's mesh with its dtypes."""
    path = path or config.model.path
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
    """The parameters of the newest checkpoint in workdir that reads back whole (and its step;
    newer ones that do not are reported, not touched), or the loaded model's and None."""
    with Checkpointer(workdir, read_only=True) as checkpointer:
        latest = checkpointer.restore_latest(model.params, None)
        if latest is None:
            return model.params, None
        step, params, _, _ = latest
        logging.info("using checkpoint %d of %s", step, checkpointer.directory)
        return params, step


def _latest_step(workdir: str) -> int | None:
    """The newest checkpoint's step in workdir, or None."""
    with Checkpointer(workdir, read_only=True) as checkpointer:
        return checkpointer.latest_step()


def check_local_workdir(config: Any, mode: str, workdir: str) -> None:
    """Raises ConfigError when a remote work directory (gs://...) is asked for something only a
    local one holds: Hugging Face directories (model.scratch, the sft warm start, --mode=export),
    the report's plots (train.write_report) or the extra categories' transcripts. Checkpoints,
    metrics, config.json, compile.json and evaluation records go through etils.epath and work
    on either."""
    if "://" not in workdir:
        return
    needs = [
        ("--mode=export", mode == "export"),
        ("--config.model.scratch.enabled", config.model.scratch.enabled and not config.model.path),
        (f"--config.sft.steps={config.sft.steps}", config.sft.steps > 0),
        ("--config.train.write_report", config.train.write_report),
        ("--config.eval.extra_categories", mode == "eval" and bool(config.eval.extra_categories)),
    ]
    named = [name for name, asked in needs if asked]
    if named:
        raise config_lib.ConfigError(
            f"{', '.join(named)} writes files that need a local --workdir, not {workdir!r}"
        )


def use_compilation_cache(path: str) -> None:
    """Makes JAX save compiled programs under `path` ("~" expanded) and reuse them in later runs.

    Does nothing when `path` is empty or JAX already has a cache directory (from the
    JAX_COMPILATION_CACHE_DIR environment variable or the caller). Programs that compile in
    0.1 s or more are kept: the rollout's bucket shapes take ~1 s each on CPU, far more on TPU.
    """
    if not path or jax.config.jax_compilation_cache_dir:
        return
    jax.config.update("jax_compilation_cache_dir", os.path.expanduser(path))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.1)
    logging.info("compilation cache: %s", jax.config.jax_compilation_cache_dir)


def _check_before_train(config: Any) -> bool:
    """Whether training first compiles its programs for this host's accelerators
    (`aot.check_before_train`; CPU runs skip it)."""
    return config.aot.check_before_train and jax.default_backend() in ("tpu", "gpu")


def run(mode: str, config: Any, workdir: str) -> None:
    """Runs `mode` ('train', 'eval', 'export' or 'compile')."""
    from seal_jax import aot, distributed, evaluation, trainer

    check_local_workdir(config, mode, workdir)
    if mode == "eval":  # an unknown extra category fails before any weight is read
        evaluation.extra_categories(config)
    use_compilation_cache(config.compilation_cache_dir)
    if config.distributed.enabled:
        distributed.initialize(config.distributed)
    if mode == "compile" or (mode == "train" and _check_before_train(config)):
        # The architecture only: no weights are read. Training stops here when it cannot fit.
        architecture = architecture_from_dir(os.path.expanduser(policy_dir(config, workdir)))
        aot.check(config, architecture, workdir, None if mode == "compile" else "")
        if mode == "compile":
            return
    if mode == "export" and _latest_step(workdir) is None:
        # Before the model (and, with model.scratch / sft.steps, a warm start) is built for nothing.
        raise CheckpointError(f"no training checkpoint in {workdir!r} to export")
    model = load_policy(config, initial_policy(config, workdir))
    if mode == "train":
        trainer.train(config, model, workdir)
        if config.train.write_report and jax.process_index() == 0:
            logging.info("report: %s", report.write_report(workdir))
    elif mode == "eval":
        params, step = _trained_params(model, workdir)
        run_ = trainer.build(config, model, workdir)
        metrics = trainer.evaluate(run_, params, step or 0)
        name = f"eval_step{step}.json" if step is not None else "eval_hf.json"
        if config.eval.extra_categories:  # BFCL single-turn and memory categories
            out = os.path.join(workdir, name.removesuffix(".json") + "_extra")
            metrics["extra"] = evaluation.evaluate_extra(
                run_.eval_engine, params, run_.chat, config, step or 0, out
            )
        record = epath.Path(workdir) / name
        if jax.process_index() == 0:
            record.write_text(json.dumps(metrics, indent=2))
        logging.info("wrote %s", record)
    elif mode == "export":
        params, step = _trained_params(model, workdir)
        if step is None:
            raise CheckpointError(f"no training checkpoint in {workdir!r} to export")
        out = os.path.join(workdir, "export")
        save_hf_checkpoint(out, params, model.config, tokenizer_dir=model.path)
        logging.info("exported step %d to %s", step, out)
