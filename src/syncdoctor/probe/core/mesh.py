"""Which ranks must agree, in the mesh's own words (framework-free): the data-parallel
dimension names, a rank's coordinates on a recorded mesh and the name of a replica
group. The torch probe (probe/torch/mesh.py) builds the layout from live tensors; the
doctor names groups from the mesh a rank recorded.
"""

from __future__ import annotations

from typing import Any

MAX_CLASSES = 4  # placement classes a check row carries (more are folded into the last)
# Mesh dimension names that shard the data (each coordinate reads its own batches);
# any other name (tp, cp, pp, ep, sp, ...) splits the model, not the data. An unnamed
# mesh is taken as all data parallel.
DATA_PARALLEL_NAMES = (
    "dp",
    "data",
    "replicate",
    "shard",
    "dp_replicate",
    "dp_shard",
    "dp_shard_cp",
    "fsdp",
    "hsdp",
    "ddp",
    "zero",
    "dp_cp",
)


def is_data_parallel(name: str, names: list[str]) -> bool:
    if all(n.startswith("dim") for n in names):
        return True
    return name in DATA_PARALLEL_NAMES


def coordinate_of(rank: int, mesh: dict[str, Any]) -> dict[str, int]:
    """A rank's coordinates on the root mesh, by dimension name."""
    ranks = mesh.get("ranks") or []
    if rank not in ranks:
        return {}
    flat, coords = ranks.index(rank), []
    for size in reversed(mesh["shape"]):
        coords.append(flat % size)
        flat //= size
    return dict(zip(mesh["dim_names"], reversed(coords), strict=False))


def group_name(dims: tuple[str, ...] | list[str], members: list[int], mesh: dict[str, Any] | None) -> str:
    """`replica group (ranks 1, 3), shard 1` in the mesh's own words: the ranks that
    must agree and the shard they hold."""
    shown = ", ".join(map(str, members[:8])) + (" …" if len(members) > 8 else "")
    if not dims or mesh is None or not members:
        return f"ranks {shown}"
    coordinate = coordinate_of(members[0], mesh)
    where = ", ".join(f"{d} {coordinate[d]}" for d in dims if d in coordinate)
    return f"replica group (ranks {shown}), {where}" if where else f"replica group (ranks {shown})"
