"""The entry point: `python run.py --config=configs/<name>.py [--config.a.b=v ...] --workdir=DIR`.

Modes: train (the SEAL loop), eval (score a policy on the evaluation split), export (write a
Hugging Face directory), compile (prove a config fits a TPU topology's memory, from the model's
config.json alone). Every user error (bad flag, bad config value, bad checkpoint) ends in one
line on stderr and exit code 2, never a traceback. Training stopped by SIGTERM or SIGINT (a
preemption notice) saves its last completed step and exits with code 75 after one line saying
what was saved (`seal_jax.preemption`); the same command continues the run.
"""

from __future__ import annotations

import importlib.util
import json
import logging as py_logging
import os
import re
import sys

from absl import app, flags, logging
from etils import epath
from ml_collections import config_flags

# seal_jax never uses torch, but tensorboardX and transformers' tokenizers import it wherever it is
# installed, to accept torch tensors we never pass: 1.9 s of a 2-step run's 11 s on 2 cores.
# Marked absent, `import torch` fails at once in this process (and the environment workers it
# spawns); transformers' advice that its models need torch does not apply to its tokenizers.
sys.modules.setdefault("torch", None)
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")

_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "Experiment config file, e.g. configs/qwen.py.", lock_config=True
)
_WORKDIR = flags.DEFINE_string("workdir", "workdirs/default", "Directory for logs and checkpoints.")
_MODE = flags.DEFINE_enum("mode", "train", ["train", "eval", "export", "compile"], "What to run.")


def _fail(message: str) -> None:
    """Prints one error line and exits with status 2."""
    print(f"error: {' '.join(str(message).split())}", file=sys.stderr)
    sys.exit(2)


def _config_file(argv: list[str]) -> str | None:
    for i, arg in enumerate(argv):
        if arg.startswith("--config="):
            return arg.split("=", 1)[1]
        if arg == "--config" and i + 1 < len(argv):
            return argv[i + 1]
    return None


def _check_override_keys(path: str, argv: list[str]) -> None:
    """Fails on `--config.a.b=...` overrides naming a key the config does not have."""
    file, _, arg = path.partition(":")
    spec = importlib.util.spec_from_file_location("_config_under_check", file)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    config = module.get_config(arg) if arg else module.get_config()
    for arg in argv:
        match = re.match(r"--config\.([\w.]+)", arg)
        if not match:
            continue
        node, parts = config, match.group(1).split(".")
        for i, part in enumerate(parts):
            if not hasattr(node, "keys") or part not in node:
                where = ".".join(parts[:i]) or "the config"
                known = ", ".join(sorted(node.keys())) if hasattr(node, "keys") else "none"
                _fail(f"unknown config key --config.{match.group(1)} ({where} has: {known})")
            node = node[part]


def parse_flags(argv: list[str]) -> list[str]:
    """absl flag parsing that turns every flag or config problem into one clear line."""
    path = _config_file(argv)
    if path is None:
        _fail("--config is required, e.g. --config=configs/qwen.py")
    if not os.path.isfile(path.split(":")[0]):
        _fail(f"config file {path!r} not found")
    try:
        _check_override_keys(path, argv)
    except Exception as e:  # noqa: BLE001  (a broken config file: say which and why)
        _fail(f"cannot load config {path!r}: {type(e).__name__}: {e}")
    try:
        rest = flags.FLAGS(argv)
        _CONFIG.value  # noqa: B018  (loads the file and applies overrides now)
    except flags.Error as e:
        _fail(re.sub(r"^Error: ", "", str(e)))
    except Exception as e:  # noqa: BLE001  (a broken config file: say which and why)
        _fail(f"cannot load config {path!r}: {type(e).__name__}: {e}")
    return rest


def _save_resolved_config(config: object, workdir: str) -> None:
    directory = epath.Path(workdir)  # a local path or gs://
    directory.mkdir(parents=True, exist_ok=True)
    text = json.dumps(config.to_dict(), indent=2, default=str)  # type: ignore[attr-defined]
    (directory / "config.json").write_text(text)


def main(argv: list[str]) -> None:
    """Validates the config, prepares the work directory and runs the selected mode."""
    if len(argv) > 1:
        _fail(f"unexpected argument(s) {' '.join(argv[1:])!r}: flags are --name=value")
    from seal_jax import config as config_lib
    from seal_jax import preemption
    from seal_jax.checkpointing import CheckpointMismatchError, UnreadableCheckpointError
    from seal_jax.models import CheckpointError

    config = _CONFIG.value
    try:
        config_lib.validate(config)
        try:
            _save_resolved_config(config, _WORKDIR.value)
        except OSError as e:
            _fail(f"cannot write to --workdir={_WORKDIR.value}: {e.strerror or e}")
        from seal_jax import modes

        modes.run(_MODE.value, config, _WORKDIR.value)
    except preemption.Preempted as stop:
        logging.warning("%s", stop)
        sys.exit(preemption.EXIT_CODE)
    except (
        config_lib.ConfigError,
        CheckpointError,
        CheckpointMismatchError,
        UnreadableCheckpointError,
        OSError,
    ) as e:
        _fail(str(e))
    logging.info("done: %s", _MODE.value)


if __name__ == "__main__":
    # jax logs a failed TPU probe at INFO on every CPU/GPU machine, and orbax logs every save in
    # detail: noise that would bury the per-step progress lines.
    py_logging.getLogger("jax._src.xla_bridge").setLevel(py_logging.WARNING)
    py_logging.getLogger("absl").addFilter(
        lambda r: r.levelno >= py_logging.WARNING or "/orbax/" not in r.pathname
    )
    app.run(main, flags_parser=parse_flags)
