"""Exact fingerprints of tensors.

Healthy data parallelism keeps parameters, reduced gradients and optimizer state
bitwise identical across ranks, so fingerprints must change with any bit: a 1-ULP
change, two swapped elements, two swapped tensors. CPU tensors are hashed in place
with xxh3 (no copy, ≈12 GB/s here); tensors on an accelerator are reduced on the
device with integer arithmetic so that no copy crosses to the host, in slices so
that the int64 temporaries stay small (the probe's extra memory budget is 5% of the
parameter bytes), and read back with one host sync for all tensors.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import torch
import xxhash

from syncdoctor.probe.core.fingerprint import to_int64

_INT_VIEW = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


_COLS = 1024
_SLICE_ROWS = 256  # 256 × 1024 int64 = 2 MiB of temporaries per slice


_PLAIN = (torch.Tensor, torch.nn.Parameter)  # not a DTensor or another subclass: hashed as it is
_HALF = 1 << 63
_FULL = 1 << 64
_xxh3 = xxhash.xxh3_64_intdigest


def tensor_fingerprint(t: torch.Tensor) -> int:
    t = t.detach()
    if t.is_cpu:
        v = _xxh3(_raw_bytes(t))  # type: ignore[arg-type]  # see _raw_bytes
        return v - _FULL if v >= _HALF else v  # to_int64, inline: this runs at every check step
    return int(device_fingerprint(t).item())


def _raw_bytes(t: torch.Tensor) -> np.ndarray:
    # An ndarray is a buffer, but numpy's stubs declare __buffer__ only for Python >= 3.12.
    if not t.is_contiguous():
        t = t.contiguous()
    if t.numel() == 0 or t.dim() == 0:
        return t.reshape(-1).view(torch.uint8).numpy() if t.numel() else np.zeros(0, dtype=np.uint8)
    return t.view(torch.uint8).numpy()  # a contiguous tensor's bytes, any shape: no reshape needed


def device_fingerprint(t: torch.Tensor) -> torch.Tensor:
    """Row sums and column sums of the raw bits seen as a (rows × 1024) matrix, each
    weighted by its odd position: a swap inside a row moves two column sums, a swap
    inside a column moves two row sums, any single-bit change moves both. Computed
    slice by slice of rows; int64 arithmetic wraps around, so the sum is exact."""
    bits = t.contiguous().reshape(-1).view(_INT_VIEW[t.element_size()])
    dev = t.device
    n_rows = bits.numel() // _COLS
    col_w = torch.arange(_COLS, device=dev, dtype=torch.int64) * 2 + 1
    row_part = torch.zeros((), device=dev, dtype=torch.int64)
    col_sums = torch.zeros(_COLS, device=dev, dtype=torch.int64)
    for r0 in range(0, n_rows, _SLICE_ROWS):
        r1 = min(n_rows, r0 + _SLICE_ROWS)
        block = bits[r0 * _COLS : r1 * _COLS].view(-1, _COLS).to(torch.int64)
        row_w = torch.arange(r0, r1, device=dev, dtype=torch.int64) * 2 + 1
        row_part += (block.sum(1) * row_w).sum()
        col_sums += block.sum(0)
    tail = bits[n_rows * _COLS :].to(torch.int64)
    tail_w = torch.arange(tail.numel(), device=dev, dtype=torch.int64) * 2 + 1
    return row_part + (col_sums * col_w).sum() * 1_000_003 + (tail * tail_w).sum() * 998_244_353 + bits.numel()


class ViewCache:
    """The byte views of tensors hashed at every check. A parameter keeps its storage
    for the whole run (optimizers update in place), so its numpy view is made once
    and re-made only when the tensor at that position has moved (a new gradient under
    zero_grad(set_to_none=True), `p.data = ...`); a cached view holds its tensor, so
    the memory it reads cannot be freed under it."""

    def __init__(self) -> None:
        self._views: dict[tuple[str, int], tuple[int, int, torch.Tensor, np.ndarray]] = {}

    def view(self, kind: str, index: int, t: torch.Tensor) -> np.ndarray:
        key = (kind, index)
        cached = self._views.get(key)
        ptr = t.data_ptr()
        if cached is not None and cached[0] == ptr and cached[1] == t.nbytes and cached[2] is t:
            return cached[3]
        view = _raw_bytes(t.detach())
        if t.is_contiguous():  # a copy made for a strided tensor is stale by the next step
            self._views[key] = (ptr, t.nbytes, t, view)
        return view


def fingerprints(
    tensors: Iterable[torch.Tensor | None], device_path: bool = False, cache: ViewCache | None = None, kind: str = ""
) -> list[int]:
    """Per-tensor fingerprints (0 for None). Accelerator tensors are reduced on their
    device and read back together: one host sync, not one per tensor. `device_path`
    sends CPU tensors that way too (tests, on machines without an accelerator)."""
    from syncdoctor.probe.torch.mesh import local_shard

    out: list[int] = []
    on_device: list[tuple[int, torch.Tensor]] = []
    # The loop runs at every check, per tensor, after the model's own work has left
    # Python's caches cold: the cached view is looked up inline (ViewCache.view's test).
    views = cache._views if cache is not None else None
    for i, t in enumerate(tensors):
        if t is None:
            out.append(0)
            continue
        if t.__class__ not in _PLAIN:
            t = local_shard(t)  # a sharded tensor: the shard this rank holds
        if t.is_cpu and not device_path:
            if views is not None:
                cached = views.get((kind, i))
                if cached is not None and cached[2] is t and cached[0] == t.data_ptr() and cached[1] == t.nbytes:
                    raw = cached[3]
                else:
                    raw = cache.view(kind, i, t)  # type: ignore[union-attr]  # views: from cache
            else:
                raw = _raw_bytes(t.detach())
            v = _xxh3(raw)  # type: ignore[arg-type]  # see _raw_bytes
            out.append(v - _FULL if v >= _HALF else v)
        else:
            on_device.append((len(out), device_fingerprint(t.detach())))
            out.append(0)
    if on_device:
        by_device: dict[torch.device, list[tuple[int, torch.Tensor]]] = {}
        for index, value in on_device:
            by_device.setdefault(value.device, []).append((index, value))
        for items in by_device.values():
            values = torch.stack([v for _, v in items]).tolist()
            for (index, _), value in zip(items, values, strict=True):
                out[index] = int(value)
    return out


def ids_fingerprint(ids: object) -> int:
    """Fingerprint of a batch's sample ids (or of its input bytes)."""
    if isinstance(ids, torch.Tensor):
        return tensor_fingerprint(ids)
    arr = np.ascontiguousarray(np.asarray(ids))
    if arr.dtype == object:
        return to_int64(xxhash.xxh3_64_intdigest(repr(arr.tolist()).encode()))
    return to_int64(xxhash.xxh3_64_intdigest(arr.tobytes()))
