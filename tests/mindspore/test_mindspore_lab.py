"""The MindSpore lab end to end: real msrun jobs with 2 CPU workers over loopback, the
probe attached zero-code by the runner (as `syncdoctor run` does).

Every job runs once per session through the `ms_jobs` cache (conftest.py; a job costs
25-60 s here, mostly msrun start-up), and each test reads the records of its job.
Whatever happens, no process naming the job's plan directory survives (the runner
sweeps /proc).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import LAB, LAB_COMMON  # type: ignore[import-not-found]

from syncdoctor.lab.faults import plans_for
from syncdoctor.lab.mindspore_runner import pids_naming, run_mindspore_lab

pytestmark = [pytest.mark.mindspore, pytest.mark.slow, pytest.mark.timeout(3000)]

COMMON = LAB_COMMON
BOUND_S = 420.0


@pytest.fixture(scope="module")
def runs(ms_jobs) -> Any:
    class Runs:
        def __getitem__(self, name: str) -> dict[str, Any]:
            return ms_jobs.get(name)

    return Runs()


def records(run: dict[str, Any]) -> dict[int, list[dict[str, Any]]]:
    out = {}
    for path in sorted((Path(run["dir"]) / "records").glob("rank*.jsonl")):
        out[int(path.stem[4:])] = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return out


def steps(run: dict[str, Any]) -> dict[int, dict[int, dict[str, Any]]]:
    return {r: {x["step"]: x for x in recs if x["kind"] == "step"} for r, recs in records(run).items()}


def snapshots(run: dict[str, Any]) -> dict[int, dict[str, Any]]:
    return {r: next(x for x in recs if x["kind"] == "snapshot") for r, recs in records(run).items()}


def first_diff(run: dict[str, Any], field: str) -> int | None:
    """The first step where the ranks' values differ, among the steps where every rank
    has one (fingerprints are taken at check steps: step 1 and every 10th)."""
    by_rank = steps(run)
    common = sorted(set.intersection(*(set(s) for s in by_rank.values())))
    for s in common:
        values = [by_rank[r][s].get(field) for r in by_rank]
        if None not in values and len(set(values)) > 1:
            return s
    return None


def measured(run: dict[str, Any], rank: int = 0) -> list[int]:
    return [s for s, x in steps(run)[rank].items() if "param_fp" in x]


def checks(run: dict[str, Any], rank: int = 0) -> list[dict[str, Any]]:
    return [x for x in records(run)[rank] if x["kind"] == "check"]


def worker_logs(run: dict[str, Any]) -> str:
    return "\n".join(Path(p).read_text(errors="replace") for p in run["logs"])


# -- every job ---------------------------------------------------------------------------
@pytest.mark.parametrize("name", list(LAB))
def test_no_worker_survives_and_bounded(runs: dict[str, Any], name: str) -> None:
    run = runs[name]
    assert not run["timed_out"], f"{name} hit the {BOUND_S}s bound"
    assert run["duration_s"] < BOUND_S
    assert pids_naming(str(Path(run["dir"]))) == []


# -- healthy ------------------------------------------------------------------------------
def test_clean_replicas_bitwise_identical_and_accurate(runs: dict[str, Any]) -> None:
    run = runs["clean"]
    assert run["returncode"] == 0, worker_logs(run)[-3000:]
    by_rank = steps(run)
    assert len(by_rank) == 2 and len(by_rank[0]) == len(by_rank[1]) == 44
    assert measured(run) == [1, 10, 20, 30, 40]
    for s in measured(run):
        assert by_rank[0][s]["param_fp"] == by_rank[1][s]["param_fp"], s
        assert by_rank[0][s]["opt_fp"] == by_rank[1][s]["opt_fp"], s
    snaps = snapshots(run)
    assert snaps[0]["init_param_fp"] == snaps[1]["init_param_fp"]
    assert snaps[0]["framework"] == "mindspore" and snaps[0]["seed"]["ms_seed"] == 0
    assert snaps[0]["ddp"]["gradients_mean"] is True
    assert snaps[0]["ddp"]["parallel_mode"] == "data_parallel"
    assert {c["status"] for c in checks(run)} == {"ok"} and len(checks(run)) == 5
    assert snaps[0]["auto"] is True and snaps[0]["style"].startswith("functional")
    for r in run["ranks"]:
        assert r["accuracy"] >= 0.9, run["ranks"]
    ids0, ids1 = (set(r["epoch1_ids"]) for r in run["ranks"])
    assert not ids0 & ids1 and len(ids0) == len(ids1) == 22 * 32  # disjoint shards
    assert "epoch: 2 step: 22, loss is" in worker_logs(run)  # LossMonitor's format


# -- faults -------------------------------------------------------------------------------
def test_graph_mode_parameter_broadcast_hides_missing_seed(runs: dict[str, Any]) -> None:
    run = runs["init-graph-broadcast"]
    snaps = snapshots(run)
    assert snaps[0]["init_param_fp_local"] != snaps[1]["init_param_fp_local"]  # built apart...
    assert snaps[0]["init_param_fp"] is None  # (what the broadcast replaced is the local one)
    assert snaps[0]["ddp"]["parameter_broadcast"] is True and snaps[0]["ddp"]["mode"] == "GRAPH"
    assert first_diff(run, "param_fp") is None  # ...and broadcast at the first graph compile
    from syncdoctor.doctor.diagnose import diagnose

    diag = diagnose([run["dir"]])  # the broadcast is the fix: a healthy GRAPH-mode run
    assert diag.verdict == "healthy", [(f.code, f.severity, f.evidence) for f in diag.findings]


def test_unseeded_shuffle_overlaps_shards(runs: dict[str, Any]) -> None:
    run = runs["unseeded-shuffle"]
    ids0, ids1 = (set(r["epoch1_ids"]) for r in run["ranks"])
    assert ids0 & ids1  # the two ranks' shards share samples, others are never seen
    assert first_diff(run, "param_fp") is None


def test_shuffle_after_shard_seeds_differ(runs: dict[str, Any]) -> None:
    run = runs["shuffle-after-shard"]
    snaps = snapshots(run)
    assert snaps[0]["seed"]["dataset_seed"] != snaps[1]["seed"]["dataset_seed"]
    assert "ShuffleDataset" in snaps[0]["loader"]["pipeline"]
    ids0, ids1 = (set(r["epoch1_ids"]) for r in run["ranks"])
    assert not ids0 & ids1  # still disjoint: each rank keeps its own fixed block


@pytest.mark.parametrize("name", ["uneven-keep", "uneven-drop"])
def test_uneven_shards_end_in_a_failed_allreduce(runs: dict[str, Any], name: str) -> None:
    run = runs[name]
    assert run["returncode"] != 0
    assert "AllReduce" in worker_logs(run)
    snaps = snapshots(run)
    assert snaps[0]["loader"]["drop_last"] is (name == "uneven-drop")
    assert snaps[0]["loader"]["dataset_len"] != snaps[1]["loader"]["dataset_len"]  # shards of different sizes
    ends = {r: recs[-1] for r, recs in records(run).items()}
    # One rank ran out of batches and ended; the other's next AllReduce failed.
    assert sorted(e.get("status") for e in ends.values()) == ["exception", "ok"], ends
    if name == "uneven-keep":  # the last partial batches differ
        sizes = {r: {x.get("samples") for x in s.values()} for r, s in steps(run).items()}
        assert sizes[0] != sizes[1]


# Summed gradients: tests/mindspore/test_zero_code.py (the same functional step, on a user's script).
def test_grad_accum_misaligned_only_counters_differ(runs: dict[str, Any]) -> None:
    run = runs["accum-no_sync"]  # extra_update, the same category, runs in `lab matrix`
    assert first_diff(run, "micro") == 20
    assert first_diff(run, "param_fp") is None  # the collectives pair, the replicas agree
    bad = [c for c in checks(run) if c["status"] == "mismatch"]
    assert bad and "counter" in bad[0]["what"] and bad[0]["step"] == 20
    assert run["returncode"] != 0  # one rank runs out of batches first: the other's AllReduce fails


def test_loss_hparam_mismatch_shows_in_snapshot(runs: dict[str, Any]) -> None:
    """In the model style: the loss Model.train was given is read from its callback."""
    run = runs["model-loss-hparam-mismatch"]
    snaps = snapshots(run)
    assert snaps[0]["style"].startswith("Model.train (PyNative")
    assert snaps[0]["loss"]["params"]["margin"] == 0.05 and snaps[1]["loss"]["params"]["margin"] == 0.1
    assert snaps[0]["loss"]["type"] == "AsymmetricLoss"
    assert first_diff(run, "param_fp") is None


def test_optimizer_state_mismatch_parts_at_onset(runs: dict[str, Any]) -> None:
    run = runs["optimizer-state-mismatch"]
    assert first_diff(run, "opt_fp") == 20
    assert first_diff(run, "param_fp") == 20
    bad = [c for c in checks(run) if c["status"] == "mismatch"]
    assert bad[0]["step"] == 20 and {"param", "opt"} <= set(bad[0]["what"])


def test_mode_mismatch_shows_in_train_mode(runs: dict[str, Any]) -> None:
    """In the cell style (the model style's own: test_zero_code.py)."""
    run = runs["cell-mode-mismatch"]
    assert run["returncode"] == 0, worker_logs(run)[-3000:]
    assert snapshots(run)[0]["style"] == "train cell TrainOneStepCell (PyNative)"
    assert len(steps(run)[0]) == 44
    assert first_diff(run, "train_mode") == 1
    by_rank = steps(run)
    assert by_rank[1][1]["train_mode"].startswith("0/") and not by_rank[0][1]["train_mode"].startswith("0/")
    assert first_diff(run, "param_fp") is None


def test_fp16_without_scaling_is_configuration_only(runs: dict[str, Any]) -> None:
    run = runs["fp16-no_scaling"]
    snap = snapshots(run)[0]
    assert snap["ddp"]["loss_scale_manager"] is None
    assert all(x["grad_fp16"] for x in steps(run)[0].values() if "grad_fp16" in x)  # reduced in float16
    assert first_diff(run, "param_fp") is None


def test_fp16_local_skip_parts_replicas(runs: dict[str, Any]) -> None:
    run = runs["fp16-local_skip"]
    assert snapshots(run)[0]["ddp"]["loss_scale_manager"]["type"] == "DynamicLossScaler"
    by_rank = steps(run)
    split = first_diff(run, "overflow")
    assert split is not None  # one rank skipped alone...
    parted = first_diff(run, "param_fp")
    assert parted is not None and split <= parted <= split + 10  # ...and from there the replicas differ
    assert any(by_rank[0][s]["overflow"] for s in by_rank[0])


def test_rank_crash_fails_fast_and_leaves_nothing(runs: dict[str, Any]) -> None:
    run = runs["rank-crash"]
    assert run["returncode"] != 0
    assert "Allocate memory failed" in (Path(run["dir"]) / "worker_1.log").read_text(errors="replace")
    assert not run["timed_out"]  # msrun ended the job itself (≈26 s after the crash here)


def test_timeout_stops_msrun_and_its_workers(tmp_path: Path) -> None:
    plans = plans_for("clean", "", 2, **COMMON)
    run = run_mindspore_lab(plans, tmp_path / "cut", timeout_s=12)
    assert run["timed_out"] and run["duration_s"] < 12 + 15
    assert pids_naming(str(tmp_path / "cut" / "plans")) == []


def test_probe_imports_without_torch() -> None:
    """The MindSpore probe must not need torch (the mindspore extra does not bring it)."""
    import subprocess

    code = (
        "import sys; sys.modules['torch'] = None\n"
        "import syncdoctor.probe.mindspore.probe, syncdoctor.probe.mindspore.attach, syncdoctor.probe.core.fingerprint"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]


# ----------------------------------------------------------------------------- the doctor
# GRAPH-mode broadcast is the fix, not a fault (healthy, above). fp16 without scaling
# changes nothing measurable on this model; what names it is the configuration (SD902).
# uneven-drop: with whole batches only, the two ranks' step records look alike until the
# longer rank's last AllReduce fails; the snapshots' shard sizes tell them apart (SD304).
DIAGNOSED = [n for n in LAB if n != "init-graph-broadcast"]


@pytest.mark.parametrize("name", DIAGNOSED)
def test_doctor_names_each_fault_and_clears_the_baseline(runs: dict[str, Any], name: str) -> None:
    from syncdoctor.doctor.diagnose import diagnose
    from syncdoctor.lab.faults import FAULTS

    fault = LAB[name][0]
    diag = diagnose([runs[name]["dir"]])
    if fault == "clean":
        assert diag.verdict == "healthy", [(f.code, f.severity, f.evidence) for f in diag.findings]
    else:
        assert diag.findings, f"{name}: nothing found"
        assert diag.findings[0].category == FAULTS[fault].category, [
            (f.code, f.category, f.confidence) for f in diag.findings
        ]
