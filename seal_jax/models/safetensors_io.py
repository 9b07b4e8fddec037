"""Minimal safetensors reader (memory-mapped, sliceable) and streaming writer.

Reading through `np.memmap` means a host only touches the bytes of the slices it asks for, which
is what lets every process load just its own shards. bfloat16 is handled through `ml_dtypes`.
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Callable, Iterable

import ml_dtypes
import numpy as np

from seal_jax.models.config import CheckpointError

DTYPES = {
    "F64": np.dtype(np.float64),
    "F32": np.dtype(np.float32),
    "F16": np.dtype(np.float16),
    "BF16": np.dtype(ml_dtypes.bfloat16),
    "I64": np.dtype(np.int64),
    "I32": np.dtype(np.int32),
}
DTYPE_NAMES = {v: k for k, v in DTYPES.items()}
_MAX_HEADER = 100 * 1024 * 1024


class SafetensorsFile:
    """The tensors of one .safetensors file, opened lazily as read-only memory maps."""

    def __init__(self, path: str):
        """Parses and validates the header of `path`; raises CheckpointError naming the file."""
        self.path = path
        if not os.path.isfile(path):
            raise CheckpointError(f"{path}: weight file is missing")
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            raw = f.read(8)
            if len(raw) < 8:
                raise CheckpointError(f"{path}: truncated (no safetensors header)")
            (header_len,) = struct.unpack("<Q", raw)
            if header_len > min(_MAX_HEADER, size - 8):
                raise CheckpointError(f"{path}: truncated or not a safetensors file")
            try:
                header = json.loads(f.read(header_len))
            except (json.JSONDecodeError, UnicodeDecodeError):
                raise CheckpointError(f"{path}: corrupt safetensors header") from None
        header.pop("__metadata__", None)
        self.data_start = 8 + header_len
        self.entries = header
        for name, e in header.items():
            if e.get("dtype") not in DTYPES:
                raise CheckpointError(f"{path}: tensor {name} has unsupported dtype {e['dtype']}")
            begin, end = e["data_offsets"]
            expected = int(np.prod(e["shape"], dtype=np.int64)) * DTYPES[e["dtype"]].itemsize
            if end - begin != expected:
                raise CheckpointError(f"{path}: tensor {name} has inconsistent offsets")
            if self.data_start + end > size:
                raise CheckpointError(
                    f"{path}: truncated ({size} bytes, tensor {name} needs {self.data_start + end})"
                )

    def shape(self, name: str) -> tuple[int, ...]:
        """Shape of tensor `name`."""
        return tuple(self.entries[name]["shape"])

    def array(self, name: str) -> np.ndarray:
        """A read-only memory map of tensor `name` (slicing reads only the bytes needed)."""
        e = self.entries[name]
        dtype = DTYPES[e["dtype"]]
        shape = tuple(e["shape"])
        if not shape or 0 in shape:
            return np.zeros(shape, dtype)
        offset = self.data_start + e["data_offsets"][0]
        return np.memmap(self.path, dtype=dtype, mode="r", offset=offset, shape=shape)


def open_checkpoint(path: str) -> dict[str, SafetensorsFile]:
    """Maps every tensor name of a HF model directory to the file holding it.

    Handles a single `model.safetensors` and sharded checkpoints with
    `model.safetensors.index.json`. Raises CheckpointError for missing, truncated or
    inconsistent files.
    """
    index_file = os.path.join(path, "model.safetensors.index.json")
    single = os.path.join(path, "model.safetensors")
    if os.path.isfile(index_file):
        try:
            with open(index_file) as f:
                weight_map = json.load(f)["weight_map"]
        except (json.JSONDecodeError, KeyError, UnicodeDecodeError):
            raise CheckpointError(f"{index_file}: corrupt index (no weight_map)") from None
        files = {
            fn: SafetensorsFile(os.path.join(path, fn)) for fn in sorted(set(weight_map.values()))
        }
        tensors = {}
        for name, fn in weight_map.items():
            if name not in files[fn].entries:
                raise CheckpointError(
                    f"{os.path.join(path, fn)}: tensor {name} listed in the "
                    "index is missing from the file"
                )
            tensors[name] = files[fn]
        return tensors
    if os.path.isfile(single):
        f = SafetensorsFile(single)
        return dict.fromkeys(f.entries, f)
    raise CheckpointError(
        f"{path}: no model.safetensors or model.safetensors.index.json (only safetensors "
        "checkpoints are supported)"
    )


def write_safetensors(
    path: str,
    tensors: Iterable[tuple[str, tuple[int, ...], np.dtype]],
    produce: Callable[[str], np.ndarray],
) -> None:
    """Writes one .safetensors file, producing each tensor's data only when it is written.

    `tensors` lists (name, shape, dtype) in file order; `produce(name)` returns the array.
    """
    tensors = list(tensors)
    header, offset = {}, 0
    for name, shape, dtype in tensors:
        nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
        header[name] = {
            "dtype": DTYPE_NAMES[np.dtype(dtype)],
            "shape": list(shape),
            "data_offsets": [offset, offset + nbytes],
        }
        offset += nbytes
    header["__metadata__"] = {"format": "pt"}  # transformers refuses files without it
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # the data section starts 8-byte aligned
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        for name, shape, dtype in tensors:
            arr = np.ascontiguousarray(produce(name), dtype=dtype)
            if arr.shape != tuple(shape):
                raise ValueError(f"tensor {name}: produced shape {arr.shape}, declared {shape}")
            f.write(arr.tobytes())
    os.replace(tmp, path)


def write_sharded(
    path: str,
    tensors: Iterable[tuple[str, tuple[int, ...], np.dtype]],
    produce: Callable[[str], np.ndarray],
    max_shard_bytes: int = 4 * 1024**3,
    write: bool = True,
) -> None:
    """Writes the weights of a Hugging Face directory: `model.safetensors`, or above
    max_shard_bytes `model-0000i-of-0000n.safetensors` shards and `model.safetensors.index.json`.

    `tensors` lists (name, shape, dtype) in file order; `produce(name)` returns the array, called
    once per tensor in that order. write=False produces every tensor without writing anything
    (a process that takes part in cross-process gathers but is not the writer).
    """
    tensors = list(tensors)
    shards, current, size = [], [], 0
    for spec in tensors:
        nbytes = int(np.prod(spec[1], dtype=np.int64)) * np.dtype(spec[2]).itemsize
        if current and size + nbytes > max_shard_bytes:
            shards.append(current)
            current, size = [], 0
        current.append(spec)
        size += nbytes
    shards.append(current)
    names = (
        ["model.safetensors"]
        if len(shards) == 1
        else [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
    )
    if not write:
        for spec in tensors:
            produce(spec[0])
        return
    os.makedirs(path, exist_ok=True)
    for fname, shard in zip(names, shards):
        write_safetensors(os.path.join(path, fname), shard, produce)
    if len(shards) > 1:
        total = sum(int(np.prod(s[1], dtype=np.int64)) * np.dtype(s[2]).itemsize for s in tensors)
        index = {
            "metadata": {"total_size": total},
            "weight_map": {spec[0]: n for n, shard in zip(names, shards) for spec in shard},
        }
        with open(os.path.join(path, "model.safetensors.index.json"), "w") as f:
            json.dump(index, f, indent=2)
