"""The mesh lab: 4 processes on a 2x2 device mesh (FSDP2 HSDP, and tensor x data
parallel), run as a user would under `syncdoctor run -- torchrun` with no code change.
Shards that differ by design stay silent; each fault is named with its category,
the replica group, the ranks, the tensor and the step within one check interval."""

from __future__ import annotations

from pathlib import Path

import pytest

from syncdoctor.doctor.diagnose import diagnose
from syncdoctor.lab.mesh_runner import run_mesh
from syncdoctor.records import read_run

pytestmark = pytest.mark.slow
CHECK_EVERY = 5
ONSET = 12


# (style, fault) of every mesh run the tests below read, started ahead with the
# session's other launches (tests/conftest.py `launches`).
LAUNCHES = [
    ("hsdp", "none"),
    ("tp", "none"),
    ("hsdp", "lr-mismatch"),
    ("hsdp", "init-mismatch"),
    ("hsdp", "replica-data"),
    ("hsdp", "mode-mismatch"),
    ("tp", "sp-norm-unreduced"),
]


def launch(key: tuple[str, str], folder: Path) -> Path:
    style, fault = key
    out = folder / f"{style}-{fault}"
    result = run_mesh(style, fault, out, steps=30, onset=ONSET, check_every=CHECK_EVERY, timeout_s=600)
    console = (out.parent / f"{out.name}.console.log").read_text()
    assert result.exit_code == 0 and not result.timed_out, console[-3000:]
    return out


@pytest.fixture
def mesh_run(launched):
    return lambda style, fault: launched((style, fault))


@pytest.mark.parametrize("style", ["hsdp", "tp"])
def test_healthy_mesh_runs_are_silent_and_shards_are_checked(mesh_run, style: str) -> None:
    out = mesh_run(style, "none")
    run = read_run(out)
    assert sorted(run.ranks) == [0, 1, 2, 3]
    for snap in run.snapshots.values():
        replica = snap["replica"]
        assert replica["mesh"]["shape"] == [2, 2] and len(replica["classes"]) >= 1
        assert snap["ddp"].get("fully_shard") is True
    assert not [e for e in run.events if "probe disabled" in str(e.get("message"))]
    checks = [c for c in run.checks if c["status"] != "ok"]
    assert not checks, checks
    assert max(c["step"] for c in run.checks) == 30  # confirmed to the end
    diag = diagnose([out])
    assert diag.verdict == "healthy", [(f.code, f.evidence) for f in diag.findings]


def test_optimizer_differing_on_one_rank_names_its_replica_group(mesh_run) -> None:
    diag = diagnose([mesh_run("hsdp", "lr-mismatch")])
    top = diag.findings[0]
    assert top.category == "optim.state_mismatch" and top.ranks == [3]
    assert top.step is not None and top.step <= CHECK_EVERY and top.tensor
    assert any("replica group (ranks 1, 3), shard 1" in line for line in top.evidence), top.evidence
    assert any("lr 0.01 (ranks 0, 1, 2) vs 0.02 (rank 3)" in line for line in top.evidence)


def test_unseeded_init_is_seen_within_replica_groups(mesh_run) -> None:
    top = diagnose([mesh_run("hsdp", "init-mismatch")]).findings[0]
    assert top.category == "model.init_mismatch" and top.step == 0 and top.ranks == [0, 1, 2, 3]


def test_a_replica_group_reading_another_groups_shard_is_data_sharding(mesh_run) -> None:
    top = diagnose([mesh_run("hsdp", "replica-data")]).findings[0]
    assert top.category == "data.sharding" and top.ranks == [0, 1, 2, 3]
    assert top.step is not None and top.step <= CHECK_EVERY
    assert "mesh dimension replicate" in top.evidence[0]


def test_mode_differing_on_one_rank_is_named(mesh_run) -> None:
    top = diagnose([mesh_run("hsdp", "mode-mismatch")]).findings[0]
    assert top.category == "model.mode_mismatch" and top.ranks == [1]
    assert ONSET <= top.step < ONSET + CHECK_EVERY


def test_unreduced_sequence_parallel_norm_parts_tensor_parallel_peers(mesh_run) -> None:
    diag = diagnose([mesh_run("tp", "sp-norm-unreduced")])
    top = diag.findings[0]
    assert top.category == "sync.incomplete_reduce", [(f.code, f.category, f.evidence) for f in diag.findings]
    assert ONSET <= top.step < ONSET + CHECK_EVERY
    assert top.tensor and top.tensor.startswith("norm.")
    assert any("replica group (ranks 0, 1)" in line or "replica group (ranks 2, 3)" in line for line in top.evidence)
