"""Exact fingerprints of numpy arrays, for probes that cannot import torch (MindSpore).

Same digest as probe/torch/fingerprint.py gives a CPU torch tensor: xxh3-64 over the raw
bytes, as a signed int64, so that a 1-ULP change, two swapped elements or two swapped
tensors all change it. `combine` and `ids_fingerprint` match that module too, so the
same bytes give the same number whichever framework wrote the record.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Sequence

import numpy as np
import xxhash

_MASK = (1 << 64) - 1


def to_int64(value: int) -> int:
    """An unsigned 64-bit digest as the signed int64 that JSON, polars and torch carry."""
    value &= _MASK
    return value - (1 << 64) if value >= 1 << 63 else value


def array_fingerprint(arr: np.ndarray) -> int:
    arr = np.ascontiguousarray(arr)
    if arr.dtype == object:
        return to_int64(xxhash.xxh3_64_intdigest(repr(arr.tolist()).encode()))
    # Raw bits, not values: -0.0 vs 0.0 and NaN payloads count as differences too.
    return to_int64(xxhash.xxh3_64_intdigest(arr.reshape(-1).view(np.uint8).tobytes()))


def fingerprints(arrays: Iterable[np.ndarray | None]) -> list[int]:
    return [0 if a is None else array_fingerprint(a) for a in arrays]


def combine(values: Sequence[int]) -> int:
    """Order-sensitive combination of per-tensor fingerprints."""
    if not values:
        return 0
    # The bytes of an int64 array, without building one.
    return to_int64(xxhash.xxh3_64_intdigest(struct.pack(f"<{len(values)}q", *values)))


def ids_fingerprint(ids: object) -> int:
    """Fingerprint of a batch's sample ids (or of its input bytes)."""
    return array_fingerprint(np.asarray(ids))
