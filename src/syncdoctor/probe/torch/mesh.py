"""Which ranks must hold the same bytes: replica groups from the device mesh and each
tensor's placement.

Plain data parallelism (DDP, a hand-written all-reduce) replicates every tensor on
every rank. Sharded and hybrid data parallelism do not: under FSDP2 / HSDP a
parameter is a `DTensor` whose local shard is replicated only across the mesh
dimensions where its placement is `Replicate()` (and across every dimension of the
root mesh its own mesh does not span: a norm weight left out of tensor parallelism
lives on the data-parallel sub-mesh and is a replica across the tensor-parallel
ranks). So each tensor gets a *replica key* on each rank: the mesh coordinates of
the dimensions it is sharded over. Two ranks whose keys are equal must hold bitwise
equal local tensors; ranks with other keys hold other shards and are not compared.

Tensors with the same sharded dimensions form a *placement class*. A rank posts, per
class, its key and the fingerprint of its local tensors of that class; the reader
compares fingerprints only between ranks that posted the same key. Plain replicated
tensors are one class whose key is the same everywhere: the DDP case, unchanged.

Data: ranks that differ only in non-data-parallel dimensions (tensor, context,
pipeline parallel) read the same batch by design; the duplicate-batch check compares
only ranks whose data-parallel coordinates differ (`data_key`).
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field
from typing import Any, overload

import torch

from syncdoctor.probe.core.mesh import MAX_CLASSES, is_data_parallel


def is_dtensor(t: Any) -> bool:
    return type(t) is not torch.Tensor and hasattr(t, "to_local") and hasattr(t, "placements")


@overload
def local_shard(t: torch.Tensor) -> torch.Tensor: ...
@overload
def local_shard(t: None) -> None: ...
def local_shard(t: torch.Tensor | None) -> torch.Tensor | None:
    """The bytes this rank holds of `t` (its shard, for a DTensor)."""
    if t is None or type(t) is torch.Tensor or type(t) is torch.nn.Parameter:
        return t
    return t.to_local() if is_dtensor(t) else t  # type: ignore[attr-defined]  # a DTensor, checked by duck type


def _key_int(parts: tuple[Any, ...]) -> int:
    if not parts:
        return 1  # the replicated class: one key on every rank
    return (zlib.crc32(repr(parts).encode()) << 1) | 1  # never 0: 0 is "no class" in a check row


@dataclass
class Placement:
    """One tensor's replica class on this rank: which named dimensions shard it
    (`dims`, the class) and this rank's coordinates on them (`key`)."""

    dims: tuple[str, ...]
    key: int


def placement_of(t: Any) -> Placement:
    if not is_dtensor(t):
        return Placement((), _key_int(()))
    mesh = t.device_mesh
    names = mesh.mesh_dim_names or tuple(f"dim{i}" for i in range(mesh.ndim))
    coords = mesh.get_coordinate() or ()
    sharded = [(names[i], coords[i]) for i, p in enumerate(t.placements) if not p.is_replicate()]
    return Placement(tuple(n for n, _ in sharded), _key_int(tuple(sharded)))


@dataclass
class ReplicaLayout:
    """The placement classes of a model's parameters on this rank."""

    classes: list[tuple[str, ...]] = field(default_factory=list)  # class -> sharded dim names
    keys: list[int] = field(default_factory=list)  # class -> this rank's key
    of_tensor: list[int] = field(default_factory=list)  # parameter index -> class
    mesh: dict[str, Any] | None = None  # the root mesh, for the snapshot and the report
    data_key: int | None = None  # this rank's data-parallel coordinates

    @property
    def sharded(self) -> bool:
        return self.mesh is not None

    def per_class(self, values: list[int]) -> list[list[int]]:
        """Per-tensor values split by class (in class order)."""
        out: list[list[int]] = [[] for _ in self.classes]
        for index, value in zip(self.of_tensor, values, strict=False):
            out[index].append(value)
        return out


def layout_of(params: list[Any], rank: int) -> ReplicaLayout:
    layout = ReplicaLayout()
    index: dict[tuple[str, ...], int] = {}
    root = None
    for p in params:
        placement = placement_of(p)
        if is_dtensor(p) and root is None:
            root = _root_mesh(p.device_mesh)
        if placement.dims not in index:
            if len(layout.classes) == MAX_CLASSES:
                # More kinds of placement than a row carries (rare): the rest share one
                # class that is never compared (its key is this rank's own).
                placement = Placement(("*",), _key_int((("rank", rank),)))
            if placement.dims not in index:
                index[placement.dims] = len(layout.classes)
                layout.classes.append(placement.dims)
                layout.keys.append(placement.key)
        layout.of_tensor.append(index[placement.dims])
    if root is not None:
        layout.mesh = describe_mesh(root, rank)
        layout.data_key = _key_int(
            tuple(
                (n, c)
                for n, c in zip(layout.mesh["dim_names"], layout.mesh["coordinate"] or [], strict=False)
                if is_data_parallel(n, layout.mesh["dim_names"])
            )
        )
    return layout


def _root_mesh(mesh: Any) -> Any:
    for attr in ("_get_root_mesh",):
        getter = getattr(mesh, attr, None)
        if callable(getter):
            try:
                return getter()
            except Exception:
                pass
    return getattr(mesh, "_root_mesh", None) or mesh


def describe_mesh(mesh: Any, rank: int) -> dict[str, Any]:
    names = list(mesh.mesh_dim_names or [f"dim{i}" for i in range(mesh.ndim)])
    coordinate = mesh.get_coordinate()
    return {
        "shape": list(mesh.mesh.shape),
        "dim_names": names,
        "coordinate": list(coordinate) if coordinate is not None else None,
        "ranks": mesh.mesh.reshape(-1).tolist()[:4096],
    }
