"""The MindSpore lab end to end: real msrun jobs with 2 CPU workers over loopback.

Every job runs once, two at a time, in a module-scoped fixture (a job costs 25-60 s
here, mostly msrun start-up), and each test reads the records of its job. Whatever
happens, no process naming the job's plan directory survives (the runner sweeps /proc).
"""

from __future__ import annotations

import json
import os
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from syncdoctor.lab.faults import plans_for
from syncdoctor.lab.mindspore_runner import pids_naming, run_mindspore_lab, run_msrun

pytestmark = [pytest.mark.mindspore, pytest.mark.slow, pytest.mark.timeout(900)]

COMMON = {"steps": 60, "onset": 20, "pg_timeout_s": 8.0}  # 3 epochs of 22 steps
JOBS: dict[str, tuple[str, str, dict[str, Any]]] = {
    "clean": ("clean", "", {}),
    "init-mismatch": ("init-mismatch", "", {}),
    "init-graph-broadcast": ("init-mismatch", "", {"extra": {"ms_mode": "graph", "parameter_broadcast": True}}),
    "unseeded-shuffle": ("unseeded-shuffle", "", {}),
    "shuffle-after-shard": ("shuffle-after-shard", "", {}),
    "uneven-shards": ("uneven-shards", "", {}),
    "grad-sum": ("grad-sum", "", {}),
    "accum-no_sync": ("grad-accum-misaligned", "no_sync", {}),
    "accum-extra_update": ("grad-accum-misaligned", "extra_update", {}),
    "loss-hparam-mismatch": ("loss-hparam-mismatch", "", {}),
    "optimizer-state-mismatch": ("optimizer-state-mismatch", "", {}),
    "mode-mismatch": ("mode-mismatch", "", {}),
    "fp16-no_scaling": ("fp16-overflow", "no_scaling", {}),
    "fp16-local_skip": ("fp16-overflow", "local_skip", {}),
    "rank-crash": ("rank-crash", "", {}),
}
BOUND_S = 150.0


def _run(name: str, root: Path) -> dict[str, Any]:
    fault, variant, extra = JOBS[name]
    plans = plans_for(fault, variant, 2, **{**COMMON, **extra})
    return run_mindspore_lab(plans, root / name, timeout_s=BOUND_S)


def _autoattach(root: Path) -> dict[str, Any]:
    """Model.train script with no probe line, under msrun, with our sitecustomize."""
    out = root / "autoattach"
    site = out / "site"
    site.mkdir(parents=True)
    (site / "sitecustomize.py").write_text(
        "from syncdoctor.probe.mindspore import install_lazy_autoattach\ninstall_lazy_autoattach()\n")
    path = os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH", "")) if p)
    script = Path(__file__).with_name("model_train_script.py")
    return run_msrun(script, [str(out)], out, 2, BOUND_S, marker=str(out),
                     env={"PYTHONPATH": path, "SYNCDOCTOR_RUN_DIR": str(out)})


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("mslab")
    with ThreadPoolExecutor(2) as pool:
        futures = {name: pool.submit(_run, name, root) for name in JOBS}
        futures["autoattach"] = pool.submit(_autoattach, root)
        results = {name: f.result() for name, f in futures.items()}
    for name, result in results.items():
        result["dir"] = root / name
    return results


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
    by_rank = steps(run)
    common = sorted(set.intersection(*(set(s) for s in by_rank.values())))
    for s in common:
        if len({by_rank[r][s][field] for r in by_rank}) > 1:
            return s
    return None


def checks(run: dict[str, Any], rank: int = 0) -> list[dict[str, Any]]:
    return [x for x in records(run)[rank] if x["kind"] == "check"]


def worker_logs(run: dict[str, Any]) -> str:
    return "\n".join(Path(p).read_text(errors="replace") for p in run["logs"])


# -- every job ---------------------------------------------------------------------------
@pytest.mark.parametrize("name", [*JOBS, "autoattach"])
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
    assert len(by_rank) == 2 and len(by_rank[0]) == len(by_rank[1]) == 66
    for s in by_rank[0]:
        assert by_rank[0][s]["param_fp"] == by_rank[1][s]["param_fp"], s
        assert by_rank[0][s]["opt_fp"] == by_rank[1][s]["opt_fp"], s
    snaps = snapshots(run)
    assert snaps[0]["init_param_fp"] == snaps[1]["init_param_fp"]
    assert snaps[0]["framework"] == "mindspore" and snaps[0]["seed"]["ms_seed"] == 0
    assert snaps[0]["ddp"]["gradients_mean"] is True
    assert snaps[0]["ddp"]["parallel_mode"] == "data_parallel"
    assert {c["status"] for c in checks(run)} == {"ok"} and len(checks(run)) == 6
    for r in run["ranks"]:
        assert r["accuracy"] >= 0.9, run["ranks"]
    ids0, ids1 = (set(r["epoch1_ids"]) for r in run["ranks"])
    assert not ids0 & ids1 and len(ids0) == len(ids1) == 22 * 32  # disjoint shards
    assert "epoch: 3 step: 22, loss is" in worker_logs(run)  # LossMonitor's format


# -- faults -------------------------------------------------------------------------------
def test_init_mismatch_parts_replicas_from_the_first_step(runs: dict[str, Any]) -> None:
    run = runs["init-mismatch"]
    snaps = snapshots(run)
    assert snaps[0]["init_param_fp"] != snaps[1]["init_param_fp"]
    assert snaps[0]["seed"]["ms_seed"] is None  # nobody called ms.set_seed
    assert first_diff(run, "param_fp") == 1
    by_rank = steps(run)
    assert all(by_rank[0][s]["param_fp"] != by_rank[1][s]["param_fp"] for s in by_rank[0])
    first = checks(run)[0]
    assert first["status"] == "mismatch" and "param" in first["what"] and first["tensor"] == "fc1.weight"


def test_graph_mode_parameter_broadcast_hides_missing_seed(runs: dict[str, Any]) -> None:
    run = runs["init-graph-broadcast"]
    snaps = snapshots(run)
    assert snaps[0]["init_param_fp"] != snaps[1]["init_param_fp"]  # built apart...
    assert snaps[0]["ddp"]["parameter_broadcast"] is True and snaps[0]["ddp"]["mode"] == "GRAPH"
    assert first_diff(run, "param_fp") is None  # ...and broadcast at the first graph compile


def test_unseeded_shuffle_overlaps_shards(runs: dict[str, Any]) -> None:
    run = runs["unseeded-shuffle"]
    ids0, ids1 = (set(r["epoch1_ids"]) for r in run["ranks"])
    assert ids0 & ids1  # the two ranks' shards share samples, others are never seen
    assert snapshots(run)[0]["loader"]["seed"] is None
    assert first_diff(run, "param_fp") is None


def test_shuffle_after_shard_seeds_differ(runs: dict[str, Any]) -> None:
    run = runs["shuffle-after-shard"]
    snaps = snapshots(run)
    assert snaps[0]["seed"]["dataset_seed"] != snaps[1]["seed"]["dataset_seed"]
    assert snaps[0]["loader"]["shuffle_before_shard"] is False
    assert "ShuffleDataset" in snaps[0]["loader"]["pipeline"]
    ids0, ids1 = (set(r["epoch1_ids"]) for r in run["ranks"])
    assert not ids0 & ids1  # still disjoint: each rank keeps its own fixed block


def test_uneven_shards_end_in_a_failed_allreduce(runs: dict[str, Any]) -> None:
    run = runs["uneven-shards"]
    assert run["returncode"] != 0
    assert "AllReduce" in worker_logs(run)
    snaps = snapshots(run)
    assert snaps[0]["loader"]["drop_last"] is False


def test_grad_sum_doubles_the_reduced_gradient(runs: dict[str, Any]) -> None:
    def ratio(run: dict[str, Any]) -> float:
        values = sorted(x["reduce_ratio"] for x in steps(run)[0].values() if x["reduce_ratio"])
        return values[len(values) // 2]

    assert snapshots(runs["grad-sum"])[0]["ddp"]["gradients_mean"] is False
    assert 1.6 < ratio(runs["grad-sum"]) / ratio(runs["clean"]) < 2.5
    assert first_diff(runs["grad-sum"], "param_fp") is None


@pytest.mark.parametrize("name", ["accum-no_sync", "accum-extra_update"])
def test_grad_accum_misaligned_only_counters_differ(runs: dict[str, Any], name: str) -> None:
    run = runs[name]
    assert first_diff(run, "micro") == 20
    assert first_diff(run, "param_fp") is None  # the collectives pair, the replicas agree
    bad = [c for c in checks(run) if c["status"] == "mismatch"]
    assert bad and "counter" in bad[0]["what"] and bad[0]["step"] == 20
    assert run["returncode"] != 0  # one rank runs out of batches first: the other's AllReduce fails


def test_loss_hparam_mismatch_shows_in_snapshot(runs: dict[str, Any]) -> None:
    run = runs["loss-hparam-mismatch"]
    snaps = snapshots(run)
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
    run = runs["mode-mismatch"]
    assert first_diff(run, "train_mode") == 1
    by_rank = steps(run)
    assert set(by_rank[1][1]["train_mode"]) == {"0"} and "1" in by_rank[0][1]["train_mode"]
    assert first_diff(run, "param_fp") is None


def test_fp16_without_scaling_is_configuration_only(runs: dict[str, Any]) -> None:
    run = runs["fp16-no_scaling"]
    snap = snapshots(run)[0]
    assert snap["ddp"]["grad_dtype"] == "float16" and snap["ddp"]["loss_scale_manager"] is None
    assert first_diff(run, "param_fp") is None


def test_fp16_local_skip_parts_replicas(runs: dict[str, Any]) -> None:
    run = runs["fp16-local_skip"]
    assert snapshots(run)[0]["ddp"]["loss_scale_manager"]["type"] == "DynamicLossScaler"
    by_rank = steps(run)
    split = first_diff(run, "overflow")
    assert split is not None  # one rank skipped alone...
    assert first_diff(run, "param_fp") == split  # ...and from there the replicas differ
    assert any(by_rank[0][s]["overflow"] for s in by_rank[0])


def test_rank_crash_fails_fast_and_leaves_nothing(runs: dict[str, Any]) -> None:
    run = runs["rank-crash"]
    assert run["returncode"] != 0
    assert "Allocate memory failed" in (Path(run["dir"]) / "worker_1.log").read_text(errors="replace")
    assert run["duration_s"] < 100


def test_autoattach_records_model_train_without_code_change(runs: dict[str, Any]) -> None:
    run = runs["autoattach"]
    assert run["returncode"] == 0, worker_logs(run)[-3000:]
    by_rank = steps(run)
    assert set(by_rank) == {0, 1} and len(by_rank[0]) == 16  # 2 epochs × 8 steps
    assert all(by_rank[0][s]["param_fp"] == by_rank[1][s]["param_fp"] for s in by_rank[0])
    snap = snapshots(run)[0]
    assert snap["ddp"]["wrapper"] == "Model.train" and snap["loader"]["num_replicas"] == 2
    assert {c["status"] for c in checks(run)} == {"ok"}


def test_timeout_stops_msrun_and_its_workers(tmp_path: Path) -> None:
    plans = plans_for("clean", "", 2, **COMMON)
    run = run_mindspore_lab(plans, tmp_path / "cut", timeout_s=12)
    assert run["timed_out"] and run["duration_s"] < 12 + 15
    assert pids_naming(str(tmp_path / "cut" / "plans")) == []


def test_probe_imports_without_torch() -> None:
    """The MindSpore probe must not need torch (the mindspore extra does not bring it)."""
    import subprocess

    code = ("import sys; sys.modules['torch'] = None\n"
            "import syncdoctor.probe.mindspore, syncdoctor.probe.fingerprint_np")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]


# ----------------------------------------------------------------------------- the doctor
# fp16 without scaling changes nothing measurable on this model (see its `measured`),
# and GRAPH-mode broadcast is the fix, not a fault: neither has a root cause to find.
DIAGNOSED = [n for n in JOBS if n not in ("init-graph-broadcast", "fp16-no_scaling")]


@pytest.mark.parametrize("name", DIAGNOSED)
def test_doctor_names_each_fault_and_clears_the_baseline(runs: dict[str, Any], name: str) -> None:
    from syncdoctor.doctor.diagnose import diagnose
    from syncdoctor.lab.faults import FAULTS

    fault = JOBS[name][0]
    diag = diagnose([runs[name]["dir"]])
    if fault == "clean":
        assert diag.verdict == "healthy", [(f.code, f.severity, f.evidence) for f in diag.findings]
    else:
        assert diag.findings, f"{name}: nothing found"
        assert diag.findings[0].category == FAULTS[fault].category, [
            (f.code, f.category, f.confidence) for f in diag.findings]


def test_doctor_init_mismatch_points_at_the_seeds(runs: dict[str, Any]) -> None:
    from syncdoctor.doctor.diagnose import diagnose

    top = diagnose([runs["init-mismatch"]["dir"]]).findings[0]
    assert top.category in ("model.init_mismatch", "data.seed")
    assert top.step == 0
    assert "ms.set_seed" in top.fix and "ds.config.set_seed" in top.fix


def test_syncdoctor_run_attaches_to_an_unmodified_msrun_job(tmp_path: Path) -> None:
    """`syncdoctor run -- msrun …` on a Model.train script with no syncdoctor line."""
    import subprocess

    from syncdoctor.doctor.diagnose import diagnose
    from syncdoctor.lab.launch import free_port

    out = tmp_path / "zero-code"
    bin_dir = Path(sys.executable).parent
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}
    cmd = [str(bin_dir / "syncdoctor"), "run", "--out", str(out), "--", str(bin_dir / "msrun"),
           "--worker_num=2", "--local_worker_num=2", "--master_addr=127.0.0.1", f"--master_port={free_port()}",
           f"--log_dir={out / 'msrun_logs'}", "--join=True", "--cluster_time_out=60",
           str(Path(__file__).with_name("model_train_script.py"))]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=BOUND_S, start_new_session=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert sorted(p.name for p in (out / "records").glob("rank*.jsonl")) == ["rank0.jsonl", "rank1.jsonl"]
    assert (out / "logs" / "rank0.log").stat().st_size > 0
    assert diagnose([out]).verdict == "healthy"
    assert pids_naming(str(out)) == []
