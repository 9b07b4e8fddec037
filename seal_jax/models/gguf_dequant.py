"""Dequantization of GGUF tensor data to float32, vectorised with NumPy.

Each quantization type stores fixed-size blocks of bytes (`gguf.GGML_QUANT_SIZES`: values per
block, bytes per block); the layouts are those of llama.cpp's ggml (`ggml-common.h`). The
arithmetic is float32 in ggml's order (scale times scale, then times the quant, minus the
min term), so the results are those of the `gguf` package's reference `gguf.quants.dequantize`
(tests/test_gguf_import.py checks every type on random blocks).

* Q8_0, Q4_0, Q4_1, Q5_0, Q5_1: blocks of 32 values with one float16 scale `d` (and a float16
  min `m` for the `_1` types); 4- or 5-bit quants (the fifth bits packed in a uint32), the low
  nibbles holding values 0-15 of a block and the high nibbles values 16-31.
* K-quants: super-blocks of 256 values in 16 or 8 sub-blocks with their own quantized scales
  (and mins), themselves scaled by the float16 `d` (and `dmin`).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType


def _f16(blocks: np.ndarray, start: int) -> np.ndarray:
    """The float16 at byte `start` of every block, as float32 [n, 1]."""
    raw = np.ascontiguousarray(blocks[:, start : start + 2])
    return raw.view(np.float16).astype(np.float32)


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """[n, 16] packed bytes -> [n, 32]: the low nibbles, then the high ones."""
    return np.concatenate([qs & 0xF, qs >> 4], axis=-1)


def _fifth_bits(qh: np.ndarray) -> np.ndarray:
    """[n, 4] bytes of a little-endian uint32 -> [n, 32] bits, value j's bit at position j."""
    return np.unpackbits(qh, axis=-1, bitorder="little")


def _q8_0(b: np.ndarray) -> np.ndarray:
    return _f16(b, 0) * b[:, 2:].view(np.int8).astype(np.float32)


def _q4_0(b: np.ndarray) -> np.ndarray:
    return _f16(b, 0) * (_nibbles(b[:, 2:]).astype(np.float32) - 8)


def _q4_1(b: np.ndarray) -> np.ndarray:
    return _f16(b, 0) * _nibbles(b[:, 4:]).astype(np.float32) + _f16(b, 2)


def _q5_0(b: np.ndarray) -> np.ndarray:
    q = _nibbles(b[:, 6:]) | (_fifth_bits(b[:, 2:6]) << 4)
    return _f16(b, 0) * (q.astype(np.float32) - 16)


def _q5_1(b: np.ndarray) -> np.ndarray:
    q = _nibbles(b[:, 8:]) | (_fifth_bits(b[:, 4:8]) << 4)
    return _f16(b, 0) * q.astype(np.float32) + _f16(b, 2)


def _k_scales_mins(s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K / Q5_K: 12 bytes -> the 6-bit scales and mins of the 8 sub-blocks, [n, 8] each.
    Sub-blocks 0-3 use the low 6 bits of bytes 0-3 (scales) and 4-7 (mins); sub-blocks 4-7 a
    nibble of bytes 8-11 and, as high bits, the top 2 bits of bytes 0-3 / 4-7."""
    scales = np.concatenate([s[:, 0:4] & 63, (s[:, 8:12] & 0xF) | ((s[:, 0:4] >> 6) << 4)], -1)
    mins = np.concatenate([s[:, 4:8] & 63, (s[:, 8:12] >> 4) | ((s[:, 4:8] >> 6) << 4)], -1)
    return scales.astype(np.float32), mins.astype(np.float32)


def _k_nibbles(qs: np.ndarray) -> np.ndarray:
    """[n, 128] bytes -> [n, 8, 32]: each 32 bytes hold sub-block 2c (low nibbles) and 2c+1."""
    qs = qs.reshape(-1, 4, 1, 32)
    return np.concatenate([qs & 0xF, qs >> 4], axis=2).reshape(-1, 8, 32)


def _q4_k(b: np.ndarray) -> np.ndarray:
    scales, mins = _k_scales_mins(b[:, 4:16])
    d, dmin = _f16(b, 0), _f16(b, 2)
    q = _k_nibbles(b[:, 16:]).astype(np.float32)
    y = (d * scales)[:, :, None] * q - (dmin * mins)[:, :, None]
    return y.reshape(-1, 256)


def _q5_k(b: np.ndarray) -> np.ndarray:
    scales, mins = _k_scales_mins(b[:, 4:16])
    d, dmin = _f16(b, 0), _f16(b, 2)
    # Bit k of high byte l is the fifth bit of value l of sub-block k.
    high = (b[:, 16:48, None] >> np.arange(8, dtype=np.uint8)) & 1  # [n, 32 (l), 8 (k)]
    q = (_k_nibbles(b[:, 48:]) | (high.transpose(0, 2, 1) << 4)).astype(np.float32)
    y = (d * scales)[:, :, None] * q - (dmin * mins)[:, :, None]
    return y.reshape(-1, 256)


def _q6_k(b: np.ndarray) -> np.ndarray:
    # Two halves of 128 values; in each, four groups g of 32 (value 128h + 32g + l): the low
    # 4 bits are a nibble of ql (g 0/1: low nibbles of bytes l / l + 32; g 2/3: high nibbles),
    # the high 2 bits are bits 2g, 2g+1 of qh byte l; each 16 values share an int8 scale.
    ql = b[:, 0:128].reshape(-1, 2, 1, 2, 32)
    low = np.concatenate([ql & 0xF, ql >> 4], axis=2).reshape(-1, 2, 4, 32)
    qh = b[:, 128:192].reshape(-1, 2, 1, 32)
    high = (qh >> (2 * np.arange(4, dtype=np.uint8))[:, None]) & 3
    q = ((low | (high << 4)).astype(np.float32) - 32).reshape(-1, 2, 4, 2, 16)
    scales = b[:, 192:208].view(np.int8).astype(np.float32).reshape(-1, 2, 4, 2, 1)
    d = _f16(b, 208).reshape(-1, 1, 1, 1, 1)
    return ((d * scales) * q).reshape(-1, 256)


def _two_bit_groups(qs: np.ndarray) -> np.ndarray:
    """Q2_K / Q3_K: [n, 64] bytes -> [n, 2, 4, 32] 2-bit values: value 128h + 32j + l is bits
    2j, 2j+1 of byte 32h + l."""
    qs = qs.reshape(-1, 2, 1, 32)
    return (qs >> (2 * np.arange(4, dtype=np.uint8))[:, None]) & 3


def _q2_k(b: np.ndarray) -> np.ndarray:
    # Each 16 values share a byte: a 4-bit scale (low nibble) and a 4-bit min (high).
    s = b[:, 0:16].reshape(-1, 2, 4, 2, 1)
    q = _two_bit_groups(b[:, 16:80]).astype(np.float32).reshape(-1, 2, 4, 2, 16)
    d = _f16(b, 80).reshape(-1, 1, 1, 1, 1)
    dmin = _f16(b, 82).reshape(-1, 1, 1, 1, 1)
    y = (d * (s & 0xF).astype(np.float32)) * q - dmin * (s >> 4).astype(np.float32)
    return y.reshape(-1, 256)


def _q3_k(b: np.ndarray) -> np.ndarray:
    # 16 6-bit scales (minus 32): low 4 bits from the nibbles of bytes 0-7 (low nibbles first),
    # high 2 bits from bytes 8-11 (scale i: bits 2(i // 4), +1 of byte 8 + i % 4).
    s = b[:, 96:108]
    low = np.concatenate([s[:, 0:8] & 0xF, s[:, 0:8] >> 4], axis=-1)
    high = (s[:, 8:12][:, None, :] >> (2 * np.arange(4, dtype=np.uint8))[:, None]) & 3
    scales = (low | (high.reshape(-1, 16) << 4)).astype(np.float32) - 32
    # The third bit: value 128h + 32j + l subtracts 4 unless bit 4h + j of hmask byte l is set.
    hmask = (b[:, 0:32, None] >> np.arange(8, dtype=np.uint8)) & 1  # [n, 32 (l), 8 (4h + j)]
    hmask = hmask.transpose(0, 2, 1).reshape(-1, 2, 4, 32)
    q = _two_bit_groups(b[:, 32:96]).astype(np.float32) - 4 * (1 - hmask).astype(np.float32)
    d = _f16(b, 108).reshape(-1, 1, 1, 1, 1)
    y = (d * scales.reshape(-1, 2, 4, 2, 1)) * q.reshape(-1, 2, 4, 2, 16)
    return y.reshape(-1, 256)


_T = GGMLQuantizationType
_BLOCKS: dict[GGMLQuantizationType, Callable[[np.ndarray], np.ndarray]] = {
    _T.Q8_0: _q8_0,
    _T.Q4_0: _q4_0,
    _T.Q4_1: _q4_1,
    _T.Q5_0: _q5_0,
    _T.Q5_1: _q5_1,
    _T.Q2_K: _q2_k,
    _T.Q3_K: _q3_k,
    _T.Q4_K: _q4_k,
    _T.Q5_K: _q5_k,
    _T.Q6_K: _q6_k,
}
_FLOATS = {_T.F32: np.float32, _T.F16: np.float16}
SUPPORTED_TYPES = (_T.F32, _T.F16, _T.BF16, *_BLOCKS)
# Blocks dequantized per NumPy call: bounds the temporaries of a large tensor.
_CHUNK_BLOCKS = 1 << 16


def dequantize(raw: np.ndarray, qtype: GGMLQuantizationType, shape: tuple[int, ...]) -> np.ndarray:
    """float32 values of one tensor from its raw GGUF bytes.

    Args:
      raw: the tensor's bytes (uint8, any shape; read in order).
      qtype: its type (SUPPORTED_TYPES).
      shape: its shape in NumPy order (rows last-dimension-contiguous, GGUF's dims reversed).
    Returns:
      A float32 array of `shape`.
    Raises:
      ValueError: an unsupported type, or a byte count that does not match the shape.
    """
    if qtype not in SUPPORTED_TYPES:
        raise ValueError(f"quantization type {qtype.name} is not supported")
    raw = np.ascontiguousarray(raw).reshape(-1).view(np.uint8)
    count = int(np.prod(shape, dtype=np.int64))
    per_block, block_bytes = GGML_QUANT_SIZES[qtype]
    if count % per_block or raw.size != count // per_block * block_bytes:
        raise ValueError(
            f"{qtype.name} tensor of shape {tuple(shape)} needs {count // per_block * block_bytes}"
            f" bytes, has {raw.size}"
        )
    if qtype in _FLOATS:
        return raw.view(_FLOATS[qtype]).astype(np.float32).reshape(shape)
    if qtype == _T.BF16:  # the top half of a float32
        return (raw.view(np.uint16).astype(np.uint32) << 16).view(np.float32).reshape(shape)
    blocks = raw.reshape(-1, block_bytes)
    out = np.empty((blocks.shape[0], per_block), np.float32)
    for start in range(0, blocks.shape[0], _CHUNK_BLOCKS):
        out[start : start + _CHUNK_BLOCKS] = _BLOCKS[qtype](blocks[start : start + _CHUNK_BLOCKS])
    return out.reshape(shape)
