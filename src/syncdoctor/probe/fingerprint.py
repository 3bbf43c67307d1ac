"""Exact fingerprints of tensors.

Healthy data parallelism keeps parameters, reduced gradients and optimizer state
bitwise identical across ranks, so fingerprints must change with any bit: a 1-ULP
change, two swapped elements, two swapped tensors. CPU tensors are hashed in place
with xxh3 (no copy, ≈12 GB/s here); tensors on an accelerator are reduced on the
device with integer arithmetic so that no copy crosses to the host.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np
import torch
import xxhash

_MASK = (1 << 64) - 1
_INT_VIEW = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def to_int64(value: int) -> int:
    """An unsigned 64-bit digest as the signed int64 that JSON, polars and torch carry."""
    value &= _MASK
    return value - (1 << 64) if value >= 1 << 63 else value


def tensor_fingerprint(t: torch.Tensor) -> int:
    t = t.detach()
    if t.device.type == "cpu":
        return to_int64(xxhash.xxh3_64_intdigest(_raw_bytes(t)))
    return int(_device_fingerprint(t).item())


def _raw_bytes(t: torch.Tensor) -> np.ndarray:
    if not t.is_contiguous():
        t = t.contiguous()
    if t.numel() == 0:
        return np.zeros(0, dtype=np.uint8)
    return t.reshape(-1).view(torch.uint8).numpy()


def _device_fingerprint(t: torch.Tensor) -> torch.Tensor:
    """Row sums and column sums of the raw bits seen as a (rows × 1024) matrix, each
    weighted by its odd position: a swap inside a row moves two column sums, a swap
    inside a column moves two row sums, any single-bit change moves both."""
    bits = t.contiguous().reshape(-1).view(_INT_VIEW[t.element_size()]).to(torch.int64)
    cols = 1024
    n_main = bits.numel() // cols * cols
    main, tail = bits[:n_main].view(-1, cols), bits[n_main:]
    row_w = torch.arange(main.shape[0], device=t.device, dtype=torch.int64) * 2 + 1
    col_w = torch.arange(cols, device=t.device, dtype=torch.int64) * 2 + 1
    tail_w = torch.arange(tail.numel(), device=t.device, dtype=torch.int64) * 2 + 1
    return (
        (main.sum(1) * row_w).sum()
        + (main.sum(0) * col_w).sum() * 1_000_003
        + (tail * tail_w).sum() * 998_244_353
        + bits.numel()
    )


def fingerprints(tensors: Iterable[torch.Tensor | None]) -> list[int]:
    return [0 if t is None else tensor_fingerprint(t) for t in tensors]


def combine(values: Sequence[int]) -> int:
    """Order-sensitive combination of per-tensor fingerprints."""
    if not values:
        return 0
    return to_int64(xxhash.xxh3_64_intdigest(np.asarray(values, dtype=np.int64).tobytes()))


def ids_fingerprint(ids: object) -> int:
    """Fingerprint of a batch's sample ids (or of its input bytes)."""
    if isinstance(ids, torch.Tensor):
        return tensor_fingerprint(ids)
    arr = np.ascontiguousarray(np.asarray(ids))
    if arr.dtype == object:
        return to_int64(xxhash.xxh3_64_intdigest(repr(arr.tolist()).encode()))
    return to_int64(xxhash.xxh3_64_intdigest(arr.tobytes()))
