"""Replica groups from placements (probe/torch/mesh.py) and the check's comparison within
them (probe/torch/check.py): fast, on real DTensors in a one-process gloo group and on
hand-made check rows."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from syncdoctor.lab.launch import free_port
from syncdoctor.probe.core.compare import CLASS_FIELDS, FIELDS, N_CLASS_COLUMNS, compare_groups
from syncdoctor.probe.core.mesh import coordinate_of, group_name
from syncdoctor.probe.torch.fingerprint import fingerprints
from syncdoctor.probe.torch.mesh import layout_of, local_shard, placement_of


@pytest.fixture(scope="module")
def one_rank_group():
    if not dist.is_initialized():
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_dtensors_are_fingerprinted_by_their_local_shard_and_classed_by_placement(one_rank_group) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    mesh = init_device_mesh("cpu", (1,), mesh_dim_names=("shard",))
    base = torch.arange(8, dtype=torch.float32)
    sharded = distribute_tensor(base, mesh, [Shard(0)])
    replicated = distribute_tensor(base, mesh, [Replicate()])
    plain = base.clone()
    assert local_shard(sharded).dtype == torch.float32 and local_shard(plain) is plain
    # The same bytes whatever wraps them: a DTensor is hashed by what this rank holds.
    assert fingerprints([sharded])[0] == fingerprints([plain])[0] == fingerprints([replicated])[0]
    assert placement_of(sharded).dims == ("shard",)
    assert placement_of(replicated).dims == () == placement_of(plain).dims
    layout = layout_of([plain, sharded, replicated, sharded], rank=0)
    assert layout.sharded and layout.classes == [(), ("shard",)] and layout.of_tensor == [0, 1, 0, 1]
    assert layout.mesh == {"shape": [1], "dim_names": ["shard"], "coordinate": [0], "ranks": [0]}
    assert layout.per_class([10, 20, 30, 40]) == [[10, 30], [20, 40]]
    assert not layout_of([plain], rank=0).sharded  # plain data parallelism: no mesh


def test_group_names_speak_in_the_mesh() -> None:
    mesh = {"shape": [2, 2], "dim_names": ["replicate", "shard"], "coordinate": [0, 0], "ranks": [0, 1, 2, 3]}
    assert coordinate_of(3, mesh) == {"replicate": 1, "shard": 1}
    assert group_name(["shard"], [1, 3], mesh) == "replica group (ranks 1, 3), shard 1"
    assert group_name([], [0, 1, 2, 3], mesh) == "ranks 0, 1, 2, 3"


def _row(
    rank: int, classes: list[tuple[int, int]], data_fp: int = 0, data_key: int | None = None, **fields: int
) -> list[int]:
    base = {f: 7 for f in FIELDS} | {"data_fp": data_fp} | fields
    section: list[int] = []
    for key, param in classes:
        section += [key, param, 0, 0]
    section += [0] * (N_CLASS_COLUMNS - len(section))
    return [base[f] for f in FIELDS] + section + [rank + 1 if data_key is None else data_key]


def test_shards_are_compared_only_within_their_replica_group() -> None:
    # HSDP on 2x2: class 0 replicated everywhere, class 1 sharded over "shard" (keys 11, 12).
    rows = [
        _row(0, [(1, 5), (11, 100)]),
        _row(1, [(1, 5), (12, 200)]),
        _row(2, [(1, 5), (11, 100)]),
        _row(3, [(1, 5), (12, 200)]),
    ]
    assert compare_groups(rows, False) == ([], [], [])  # other shards differ by design
    rows[3] = _row(3, [(1, 5), (12, 201)])  # rank 3 parts from its replica, rank 1
    what, ranks, groups = compare_groups(rows, False)
    assert what == ["param"] and ranks == [1, 3]  # a pair: no majority inside it
    assert groups == [{"class": 1, "members": [1, 3], "odd": [1, 3], "what": ["param"]}]
    assert len(CLASS_FIELDS) == 4


def test_tensor_parallel_peers_may_read_the_same_batch_but_data_shards_may_not() -> None:
    # TP x DP: ranks 0/1 (data key 1) and 2/3 (data key 2) read the same batch by design.
    rows = [_row(r, [(1, 5)], data_fp=50 + r // 2, data_key=1 + r // 2) for r in range(4)]
    assert compare_groups(rows, False)[0] == []
    rows[2] = _row(2, [(1, 5)], data_fp=50, data_key=2)  # data shard 1 reads shard 0's batch
    what, ranks, _ = compare_groups(rows, False)
    assert what == ["data"] and ranks == [0, 1, 2]
