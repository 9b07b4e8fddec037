"""Run metrics a person can plot: one JSONL line and TensorBoard scalars per step.

Only process 0 writes (all processes hold the same replicated metrics). Values that are not
scalars (dicts of per-tag numbers, lists of active interface components) go to the JSONL line as
they are; TensorBoard gets every numeric leaf under its slash-joined name.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np
from tensorboardX import SummaryWriter


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
    """Appends per-step records to `<workdir>/metrics.jsonl` and TensorBoard event files."""

    def __init__(self, workdir: str):
        """Opens (appending) the writers in workdir; a no-op on processes other than 0."""
        self.enabled = jax.process_index() == 0
        if not self.enabled:
            return
        os.makedirs(workdir, exist_ok=True)
        self._jsonl = open(os.path.join(workdir, "metrics.jsonl"), "a")  # noqa: SIM115
        self._tb = SummaryWriter(os.path.join(workdir, "tensorboard"))

    def write(self, step: int, record: Mapping[str, Any]) -> None:
        """Writes one record (nested mapping of metrics) for `step`."""
        if not self.enabled:
            return
        plain = _plain(record)
        self._jsonl.write(json.dumps({"step": step, "wall_time": time.time(), **plain}) + "\n")
        self._jsonl.flush()
        for name, value in flatten_scalars(plain).items():
            self._tb.add_scalar(name, value, step)
        self._tb.flush()

    def close(self) -> None:
        """Flushes and closes the files."""
        if self.enabled:
            self._jsonl.close()
            self._tb.close()


def read_jsonl(path: str) -> list[dict]:
    """All records of a metrics.jsonl file (for plots and tests)."""
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]
