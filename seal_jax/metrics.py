"""Run metrics a person can plot: one JSONL line and TensorBoard scalars per step.

Only process 0 writes (all processes hold the same replicated metrics). Values that are not
scalars (dicts of per-tag numbers, lists of active interface components) go to the JSONL line as
they are; TensorBoard gets every numeric leaf under its slash-joined name.

metrics.jsonl is written whole after each record, to a temporary file then renamed, through
etils.epath: the work directory may be gs:// (whose objects cannot be appended to), and a process
killed mid-write leaves the previous version. A resumed run keeps the records up to its
checkpoint's step and drops those of the steps it runs again.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np
from etils import epath
from tensorboardX import SummaryWriter

FILE = "metrics.jsonl"


def _plain(value: Any) -> Any:
    """JSON-able copy of value (numpy / jax scalars and arrays become Python numbers / lists)."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        items = sorted(value) if isinstance(value, (set, frozenset)) else value
        return [_plain(v) for v in items]
    if isinstance(value, (jax.Array, np.ndarray, np.generic)):
        arr = np.asarray(value)
        return arr.item() if arr.ndim == 0 else arr.tolist()
    return value


def flatten_scalars(record: Mapping[str, Any], prefix: str = "") -> dict[str, float]:
    """{"a/b": 1.0, ...} for every finite numeric leaf of a nested mapping."""
    out = {}
    for key, value in record.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(flatten_scalars(value, name + "/"))
        elif isinstance(value, (bool, int, float)) and math.isfinite(float(value)):
            out[name] = float(value)
    return out


class MetricsWriter:
    """Writes per-step records to `<workdir>/metrics.jsonl` and TensorBoard event files."""

    def __init__(self, workdir: str, keep_through: int | None = None):
        """Opens the writers in workdir (a local path or gs://); a no-op on processes other than
        0. `keep_through`: keep only the records of steps up to it (a resumed run's step; -1: a
        fresh run, none); None keeps every record."""
        self.enabled = jax.process_index() == 0
        if not self.enabled:
            return
        directory = epath.Path(workdir)
        directory.mkdir(parents=True, exist_ok=True)
        self._path = directory / FILE
        self._lines = []
        if self._path.exists():
            lines = self._path.read_text().splitlines()
            self._lines = [
                line
                for line in lines
                if line.strip()
                and (keep_through is None or json.loads(line)["step"] <= keep_through)
            ]
        self._tb = SummaryWriter(str(directory / "tensorboard"))

    def __enter__(self) -> MetricsWriter:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def write(self, step: int, record: Mapping[str, Any]) -> None:
        """Writes one record (nested mapping of metrics) for `step`."""
        if not self.enabled:
            return
        plain = _plain(record)
        self._lines.append(json.dumps({"step": step, "wall_time": time.time(), **plain}))
        temporary = self._path.with_name(FILE + ".tmp")
        temporary.write_text("\n".join(self._lines) + "\n")
        temporary.replace(self._path)
        for name, value in flatten_scalars(plain).items():
            self._tb.add_scalar(name, value, step)
        self._tb.flush()

    def close(self) -> None:
        """Flushes and closes the TensorBoard writer."""
        if self.enabled:
            self._tb.close()


def read_jsonl(path: str) -> list[dict]:
    """All records of a metrics.jsonl file (for plots and tests)."""
    text = epath.Path(path).read_text()
    return [json.loads(line) for line in text.splitlines() if line.strip()]
