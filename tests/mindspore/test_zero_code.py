"""`syncdoctor run -- msrun ...` on a MindSpore script with no syncdoctor line in it, in
every way people write the training step (tests/mindspore/user_train.py): records on
every rank, the style named at start-up, the baseline healthy, and each fault named."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from conftest import OPS_STYLES, ZERO_CODE, ops_dir, run_dir_entry  # type: ignore[import-not-found]

from syncdoctor.probe.mindspore.watch import STAGES

pytestmark = [pytest.mark.mindspore, pytest.mark.slow, pytest.mark.timeout(3000)]

STYLES = ("model", "cell", "functional")
STYLE_LINE = {
    "model": "to Model.train (PyNative",
    "cell": "to train cell TrainOneStepCell (PyNative)",
    "functional": "to functional: value_and_grad + optimizer(grads) (Momentum, PyNative)",
    "cell-graph": "to train cell TrainOneStepCell (GRAPH)",
    "jit": "to a jitted step function `train_step`",
}


def records(run: dict[str, Any]) -> dict[int, list[dict[str, Any]]]:
    out = {}
    for path in sorted((Path(run["dir"]) / "records").glob("rank*.jsonl")):
        out[int(path.stem[4:])] = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return out


def diagnosis(run: dict[str, Any]):
    from syncdoctor.doctor.diagnose import diagnose

    return diagnose([run["dir"]])


def findings(run: dict[str, Any]) -> list[tuple[str, str, int | None]]:
    return [(f.code, f.category, f.step) for f in diagnosis(run).findings]


@pytest.mark.parametrize("name", list(ZERO_CODE))
def test_every_rank_records_and_nothing_survives(ms_jobs, name: str) -> None:
    from syncdoctor.lab.mindspore_runner import pids_naming

    run = ms_jobs.get(name)
    assert not run["timed_out"] and run["returncode"] == 0, Path(str(run["dir"]) + ".out").read_text()[-3000:]
    recs = records(run)
    assert set(recs) == {0, 1}
    for rank, lines in recs.items():
        assert lines[0]["kind"] == "snapshot" and lines[0]["auto"] is True, rank
        assert len([x for x in lines if x["kind"] == "step"]) == 32, rank  # 2 epochs of 16 batches
        assert lines[-1]["kind"] == "end" and lines[-1]["status"] == "ok"
        log = (Path(run["dir"]) / "logs" / f"rank{rank}.log").read_text(errors="replace")
        style = ZERO_CODE[name]["STYLE"]
        assert f"syncdoctor: probe attached on rank {rank} {STYLE_LINE[style]}" in log
    assert run["survivors"] == [] and pids_naming(str(run["dir"]), env=run_dir_entry(run["dir"])) == []


@pytest.mark.parametrize("style", [*STYLES, "cell-graph", "jit"])
def test_clean_baseline_is_healthy(ms_jobs, style: str) -> None:
    run = ms_jobs.get(f"zc-{style}-clean")
    diag = diagnosis(run)
    assert diag.verdict == "healthy", [(f.code, f.severity, f.evidence) for f in diag.findings]
    steps = {r: {x["step"]: x for x in lines if x["kind"] == "step"} for r, lines in records(run).items()}
    measured = [s for s in steps[0] if "param_fp" in steps[0][s]]
    assert measured[:2] == [1, 10] and all(steps[0][s]["param_fp"] == steps[1][s]["param_fp"] for s in measured)
    assert all(x["status"] == "ok" for x in records(run)[0] if x["kind"] == "check")
    assert steps[0][1]["loss"] is not None and steps[0][1]["samples"] == 16


@pytest.mark.parametrize("style", STYLES)
def test_unseeded_init_is_named_at_step_0_with_both_seeds(ms_jobs, style: str) -> None:
    top = diagnosis(ms_jobs.get(f"zc-{style}-unseeded")).findings[0]
    assert top.category in ("model.init_mismatch", "data.seed") and top.step == 0
    assert "ms.set_seed" in top.fix and "ds.config.set_seed" in top.fix


@pytest.mark.parametrize("style", STYLES)
def test_summed_gradients_are_named(ms_jobs, style: str) -> None:
    assert findings(ms_jobs.get(f"zc-{style}-summed"))[0][1] == "sync.reduce_op"


@pytest.mark.parametrize("style", STYLES)
def test_a_rank_left_in_eval_mode_is_named(ms_jobs, style: str) -> None:
    top = diagnosis(ms_jobs.get(f"zc-{style}-eval-rank")).findings[0]
    assert top.category == "model.mode_mismatch" and top.ranks == [1]


@pytest.mark.parametrize("style", ["cell-graph", "jit"])
def test_graph_mode_and_jitted_step_name_all_three_faults(ms_jobs, style: str) -> None:
    found = findings(ms_jobs.get(f"zc-{style}-three"))
    assert ("SD501", "model.init_mismatch", 0) in found
    categories = {category for _, category, _ in found}
    assert {"sync.reduce_op", "model.mode_mismatch"} <= categories, found


def test_functional_style_measures_the_reduction(ms_jobs) -> None:
    """PyNative: the reducer's input (local gradients) and output are reachable, and
    summing (gradients_mean=False) doubles the reduced gradient on 2 ranks."""

    def ratios(name: str) -> list[float]:
        lines = records(ms_jobs.get(name))[0]
        return sorted(x["reduce_ratio"] for x in lines if x["kind"] == "step" and "reduce_ratio" in x)

    clean, summed = ratios("zc-functional-clean"), ratios("zc-functional-summed")
    assert clean and summed and 1.6 < summed[len(summed) // 2] / clean[len(clean) // 2] < 2.5
    recs = records(ms_jobs.get("zc-functional-summed"))
    assert recs[0][0]["ddp"]["gradients_mean"] is False
    fps = [{x["step"]: x["param_fp"] for x in recs[r] if x["kind"] == "step" and "param_fp" in x} for r in (0, 1)]
    assert fps[0] and fps[0] == fps[1]  # summed on every rank alike: the replicas still agree


def test_no_step_seen_says_how_to_fix(tmp_path: Path) -> None:
    """A loop that draws batches but updates with its own numpy code: the probe says it
    could not attach, and the line that fixes it (one process, no msrun needed)."""
    import os
    import subprocess
    import sys

    script = tmp_path / "numpy_update.py"
    script.write_text(
        "import mindspore.dataset as ds, numpy as np\n"
        "data = ds.NumpySlicesDataset({'x': np.zeros((64, 2), np.float32)}, shuffle=False).batch(2)\n"
        "w = np.zeros(2)\n"
        "for (x,) in data.create_tuple_iterator(output_numpy=True):\n"
        "    w -= 0.1 * x.mean(0)\n"
    )
    out = tmp_path / "run"
    env = {**os.environ, "RANK_ID": "0", "RANK_SIZE": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "syncdoctor.cli", "run", "--out", str(out), "--", sys.executable, str(script)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "the probe could not attach" in proc.stderr and "MindSporeProbe(net, optimizer)" in proc.stderr


# Fields the MindSpore probe writes only where these jobs do not go, and why.
MS_NOT_IN_THESE_RUNS = {
    ("snapshot", "init_param_fp_local"): "GRAPH mode with parameter_broadcast (test_mindspore_lab.py)",
    ("snapshot.loader", "shuffle_op"): "a pipeline with a shuffle operation",
    ("snapshot.loader", "shuffle_buffer"): "as above",
    ("snapshot.loader", "error"): "a pipeline that cannot be read",
    ("step", "ids"): "a script that passes batch_ids to MindSporeProbe.after_step",
    ("step", "loss_scale"): "a loss scaler (test_mindspore_lab.py fp16 faults)",
    ("step", "overflow"): "as above",
    ("step", "nonfinite"): "a NaN or inf loss",
}


def test_probe_writes_the_record_contract(ms_jobs) -> None:
    """Every record of these runs keeps records/contract.py (the validating writer was
    on), and together they write every field the contract says this probe writes
    (tests/unit/test_record_contract.py holds the torch probe, the reader and the doctor to it)."""
    from syncdoctor.records import contract
    from tests.unit.test_record_contract import check_probe_runs

    runs = [Path(ms_jobs.get(name)["dir"]) for name in ("zc-model-clean", "zc-functional-clean", "zc-model-eval-rank")]
    check_probe_runs(runs, contract.MINDSPORE, MS_NOT_IN_THESE_RUNS)


def _ops(run: dict[str, Any]) -> dict[int, dict[str, dict[str, str]]]:
    folder = ops_dir(Path(run["dir"]))
    return {int(p.stem[3:]): json.loads(p.read_text()) for p in sorted(folder.glob("ops*.json"))}


@pytest.mark.parametrize("style", OPS_STYLES)
def test_probe_is_invisible_to_the_users_objects(ms_jobs, style: str) -> None:
    """Deep copies of the network and the optimizer, checkpoints saved, loaded and put
    back, pickling, traversals and repr (tests/mindspore/user_ops.py), right after the
    optimizer is built, after the first step and right before a check step: every
    outcome is the same under `syncdoctor run` as without it."""
    plain, probed = ms_jobs.get(f"plain-{style}-clean"), ms_jobs.get(f"zc-{style}-clean")
    assert plain["returncode"] == probed["returncode"] == 0
    expected, seen = _ops(plain), _ops(probed)
    assert sorted(expected) == [0, 1] and all(sorted(m) == ["built", "check", "step1"] for m in expected.values())
    differs = [
        f"rank {rank} {moment} {op}: plain {outcome!r}, probe {seen.get(rank, {}).get(moment, {}).get(op)!r}"
        for rank, moments in expected.items()
        for moment, outcomes in moments.items()
        for op, outcome in outcomes.items()
        if seen.get(rank, {}).get(moment, {}).get(op) != outcome
    ]
    assert not differs, "\n".join(differs)


# -- the settings that decide the reduce, at start ----------------------------------------
def test_a_reducer_that_sums_under_a_mean_context_is_named_at_step_0(ms_jobs) -> None:
    """`nn.DistributedGradReducer(params, mean=False)` with gradients_mean=True, the step
    under @ms.jit: no gradient reaches Python, the reducer's settings do (read when it was
    built). A sum with the learning rate divided by N would be right: a warning."""
    diag = diagnosis(ms_jobs.get("zc-jit-reducer-sum"))
    top = diag.findings[0]
    assert diag.verdict == "sync_problem" and (top.code, top.category, top.step) == ("SD403", "sync.reduce_op", 0)
    assert top.severity == "warning" and "mean=False" in top.evidence[0] and "gradients_mean=True" in top.evidence[0]
    ddp = records(ms_jobs.get("zc-jit-reducer-sum"))[1][0]["ddp"]
    assert (ddp["reducer_mean"], ddp["reducer_mean_from"], ddp["reducer_group_size"]) == (False, "argument", 2)


def test_a_reducer_degree_that_is_not_the_group_size_is_named_at_step_0(ms_jobs) -> None:
    top = diagnosis(ms_jobs.get("zc-jit-reducer-degree")).findings[0]
    assert (top.code, top.category, top.step, top.severity) == ("SD403", "sync.reduce_op", 0, "error")
    assert "degree=4" in top.evidence[0] and "2 ranks" in top.evidence[0]


def test_a_reducer_that_averages_is_healthy_whatever_the_context_says(ms_jobs) -> None:
    """mean=True passed to the reducer, gradients_mean=False in the context: the reducer
    averages (the context is read only by reducers built without `mean`)."""
    run = ms_jobs.get("zc-jit-mean-ctxfalse")
    diag = diagnosis(run)
    assert diag.verdict == "healthy", [(f.code, f.evidence) for f in diag.findings]
    assert records(run)[0][0]["ddp"]["gradients_mean"] is False


def test_a_per_rank_dataset_seed_is_named_at_step_0(ms_jobs) -> None:
    """ds.config.set_seed(100 + rank) before a sharded, shuffled source: each rank's
    DistributedSampler permutes with its own seed; named before any sample is read."""
    run = ms_jobs.get("zc-functional-dsseed")
    top = diagnosis(run).findings[0]
    assert (top.code, top.category, top.step) == ("SD301", "data.seed", 0), top
    assert [records(run)[r][0]["loader"]["seed"] for r in (0, 1)] == [100, 101]


# -- which stages each style lets the probe observe (docs/mindspore.md, the style x stage table)
Y, N, NA = True, False, None  # observed, not observable in the style, not in use
STAGE_TABLE: dict[str, dict[str, bool | None]] = {
    # style: params_start, data, modes, loss, grads_local, reduce_settings, grads_reduced, loss_scale, optimizer, params
    "model": dict(zip(STAGES, (Y, Y, Y, Y, N, Y, N, NA, Y, Y), strict=True)),
    "cell": dict(zip(STAGES, (Y, Y, Y, Y, Y, Y, Y, NA, Y, Y), strict=True)),
    "cell-graph": dict(zip(STAGES, (Y, Y, Y, Y, N, Y, N, NA, Y, Y), strict=True)),
    "functional": dict(zip(STAGES, (Y, Y, Y, Y, Y, Y, Y, NA, Y, Y), strict=True)),
    "jit": dict(zip(STAGES, (Y, Y, Y, Y, N, Y, N, NA, Y, Y), strict=True)),
}


@pytest.mark.parametrize("style", list(STAGE_TABLE))
def test_each_style_says_which_stages_it_observed(ms_jobs, style: str) -> None:
    """The snapshot's `stages` on every rank, as the docs' table has it; a stage the style
    hides is said beside the verdict with what stood in for it, and the verdict is
    still healthy (the reducer's settings and the parameters stand in for the gradients)."""
    run = ms_jobs.get(f"zc-{style}-clean")
    for rank, lines in records(run).items():
        declared = {name: value["observed"] for name, value in lines[0]["stages"].items()}
        assert declared == STAGE_TABLE[style], (rank, declared)
    diag = diagnosis(run)
    hidden = [line for line in diag.coverage if line.startswith("not observed")]
    if STAGE_TABLE[style]["grads_reduced"] is N:
        assert len(hidden) == 1 and "gradients after the reduce" in hidden[0], diag.coverage
        assert "what stood in: the reducer's settings" in hidden[0]
    else:
        assert not hidden, diag.coverage
    assert diag.verdict == "healthy"


def test_a_reduce_nothing_observes_is_not_called_healthy(ms_jobs) -> None:
    """A hand-written mean (ops.AllReduce, then / world) under @ms.jit: no reducer to
    read and no gradient reaching Python. The run is healthy, but a sum there would
    look the same: the verdict is inconclusive and says why."""
    run = ms_jobs.get("zc-jit-opsreduce")
    diag = diagnosis(run)
    assert diag.verdict == "inconclusive" and not diag.findings, [(f.code, f.evidence) for f in diag.findings]
    assert any("the reducer's settings" in line and "nothing stood in" in line for line in diag.coverage)
    assert records(run)[0][0]["stages"]["reduce_settings"]["observed"] is False
