"""The cross-rank compare, framework-free: the order of the values each rank posts at
a check, and what differs across ranks in a gathered table of them, with the ranks
outside the majority. The torch probe's store exchange (probe/torch/check.py) and the
MindSpore probe's AllGather (probe/mindspore/probe.py) both hand their tables here, so
both name the same fields the same way.
"""

from __future__ import annotations

import json
import struct
import zlib
from typing import Any

import numpy as np

from syncdoctor.probe.core.fingerprint import combine, to_int64
from syncdoctor.probe.core.mesh import MAX_CLASSES
from syncdoctor.probe.core.verdict import COMPARED

TENSOR_GROUPS = 64  # per-tensor fingerprints travel as at most this many groups of consecutive tensors

# The order of the gathered vector. Floats travel as their IEEE bits.
FIELDS = (*COMPARED, "loss_bits", "grad_norm_bits")
N_INT = FIELDS.index("mode")  # the fields taken from the record as they are
# Job-wide: every rank must agree on these, whatever the parallelism.
MUST_MATCH = ("step", "backward", "opt_steps", "micro", "config_fp", "mode")
# Per placement class (probe/torch/mesh.py): the class's replica key on this rank, then the
# fingerprints of its local parameters, optimizer state and reduced gradients. Ranks
# that posted the same key must agree on the three. Under DDP there is one class with
# one key: every rank is compared with every other, as the whole-model fingerprints were.
CLASS_FIELDS = ("key", "param_fp", "opt_fp", "grad_fp")
CLASS_WHAT = {"param_fp": "param", "opt_fp": "opt", "grad_fp": "grad"}
N_CLASS_COLUMNS = len(CLASS_FIELDS) * MAX_CLASSES
# After the classes: the data key (ranks with equal keys may read the same batch, as
# tensor-parallel peers do), then the per-tensor fingerprint groups.
WIDTH = len(FIELDS) + N_CLASS_COLUMNS + 1
WHAT = {
    "step": "counter",
    "backward": "counter",
    "opt_steps": "counter",
    "micro": "counter",
    "param_fp": "param",
    "opt_fp": "opt",
    "grad_fp": "grad",
    "buffer_fp": "buffer",
    "config_fp": "config",
    "mode": "mode",
}


def config_fingerprint(snapshot: dict[str, Any]) -> int:
    """What must be configured alike on every rank: loss and optimizer hyperparameters
    and the DDP settings (not the loader: its rank differs by design)."""
    keep = {k: snapshot.get(k) for k in ("loss", "optimizer", "ddp", "groups") if k in snapshot}
    return to_int64(zlib.crc32(json.dumps(keep, sort_keys=True, default=str).encode()) * 0x9E3779B97F4A7C15)


def groups_fingerprint(groups: list[dict[str, Any]]) -> int:
    """The optimizer's current hyperparameters (a scheduler moves lr on every rank
    alike): repr, not JSON, at every detailed step (a tenth of the cost)."""
    text = repr([sorted(g.items()) for g in groups])
    return to_int64(zlib.crc32(text.encode()) * 0x9E3779B97F4A7C15)


def group_bounds(n: int) -> list[tuple[int, int]]:
    """[start, end) of each group of consecutive tensors: one tensor per group up to
    TENSOR_GROUPS tensors, then TENSOR_GROUPS groups of near-equal size."""
    groups = min(n, TENSOR_GROUPS)
    return [(g * n // groups, (g + 1) * n // groups) for g in range(groups)]


def tensor_groups(fps: list[int]) -> list[int]:
    """Per-tensor fingerprints folded into group_bounds(len(fps)) groups."""
    if len(fps) <= TENSOR_GROUPS:
        return fps
    return [combine(fps[a:b]) for a, b in group_bounds(len(fps))]


def rows_of(block: bytes) -> np.ndarray:
    """A posted block as (checks x values); empty when it is not one (a foreign key)."""
    data = np.frombuffer(block, dtype=np.int64)
    if data.size < 2 or data[0] < 1 or data[1] < 1 or data.size != 2 + int(data[0]) * int(data[1]):
        return np.zeros((0, 1), dtype=np.int64)
    return data[2:].reshape(int(data[0]), int(data[1]))


_DOUBLE = struct.Struct("<d")
_INT64 = struct.Struct("<q")


def float_bits(value: float | None) -> int:
    return 0 if value is None else _INT64.unpack(_DOUBLE.pack(float(value)))[0]


def bits_float(bits: int) -> float | None:
    return None if bits == 0 else struct.unpack("<d", struct.pack("<q", int(bits)))[0]


def plain_row(values: list[int], rank: int) -> list[int]:
    """A row of FIELDS only (plain data parallelism) with its class section: one
    replicated class holding the whole-model fingerprints, and a data key of its own."""
    at = {f: values[i] for i, f in enumerate(FIELDS)}
    classes = [1, at["param_fp"], at["opt_fp"], at["grad_fp"]] + [0] * (N_CLASS_COLUMNS - len(CLASS_FIELDS))
    return [*values[: len(FIELDS)], *classes, rank + 1]


def compare(table: list[list[int]], buffers_must_match: bool) -> tuple[list[str], list[int]]:
    """What differs across ranks in a gathered table (rows: ranks), and which ranks."""
    what, ranks, _ = compare_groups(table, buffers_must_match)
    return what, ranks


def compare_groups(
    table: list[list[int]], buffers_must_match: bool
) -> tuple[list[str], list[int], list[dict[str, Any]]]:
    """What differs, which ranks, and the replica groups that disagree:
    [{"class": c, "members": [...], "odd": [...], "what": [...]}]."""
    # Here, not at the top: a rank imports this module at start-up, and reaches this
    # function only when a check disagrees (its import is start-up time of every rank).
    from syncdoctor.records.compare import majority_outliers

    table = [row if len(row) >= WIDTH else plain_row(row, r) for r, row in enumerate(table)]
    column = {f: [row[i] for row in table] for i, f in enumerate(FIELDS)}
    fields = list(MUST_MATCH) + (["buffer_fp"] if buffers_must_match else [])
    what: list[str] = []
    ranks: set[int] = set()
    for name in fields:
        values = column[name]
        if len(set(values)) > 1:
            if WHAT[name] not in what:
                what.append(WHAT[name])
            ranks.update(majority_outliers(dict(enumerate(values))))
    groups = []
    for c in range(MAX_CLASSES):
        base = len(FIELDS) + c * len(CLASS_FIELDS)
        members_by_key: dict[int, list[int]] = {}
        for r, row in enumerate(table):
            if row[base]:
                members_by_key.setdefault(row[base], []).append(r)
        for members in members_by_key.values():
            differing = []
            odd: set[int] = set()
            for offset, name in enumerate(CLASS_FIELDS[1:], 1):
                by_rank = {r: table[r][base + offset] for r in members}
                if len(set(by_rank.values())) > 1:
                    differing.append(CLASS_WHAT[name])
                    odd.update(majority_outliers(by_rank))
            if differing:
                groups.append({"class": c, "members": members, "odd": sorted(odd), "what": differing})
                what.extend(w for w in differing if w not in what)
                ranks.update(odd)
    data_key = [row[WIDTH - 1] for row in table]
    readers: dict[int, set[int]] = {}  # a batch -> the data keys that read it
    for r, v in enumerate(column["data_fp"]):
        if v:
            readers.setdefault(v, set()).add(data_key[r])
    duplicates = {v for v, keys in readers.items() if len(keys) > 1}
    if duplicates:
        what.append("data")
        ranks.update(i for i, v in enumerate(column["data_fp"]) if v in duplicates)
    return what, sorted(ranks), groups


def groups_agree(keys: np.ndarray, values: np.ndarray) -> bool:
    """Whether, at every check, the ranks that posted the same key posted the same
    values (keys: ranks x checks; values: ranks x checks x fields)."""
    for n in range(keys.shape[1]):
        seen: dict[int, bytes] = {}
        for r in range(keys.shape[0]):
            key = int(keys[r, n])
            if not key:
                continue
            value = values[r, n].tobytes()
            if seen.setdefault(key, value) != value:
                return False
    return True
