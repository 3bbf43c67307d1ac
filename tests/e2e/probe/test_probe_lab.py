"""The probe on real lab runs (2 ranks over gloo, shared with the lab and doctor tests
through the session-wide `lab` fixture): every fault that changes replica state is
reported within K steps of its onset, with the ranks involved and the first
differing tensor; clean runs report nothing; the check never outlives a dead rank."""

from __future__ import annotations

import json
import math

import polars as pl
import pytest

from syncdoctor.doctor.evidence import Evidence
from syncdoctor.lab.plan import RankPlan
from syncdoctor.lab.runner import LAB_CHECK_EVERY, run_lab
from syncdoctor.probe.torch.check import MAX_BLOCK, READ_EVERY_STEPS
from syncdoctor.probe.torch.probe import DETAIL_EVERY
from syncdoctor.records import RunRecords, read_run

pytestmark = pytest.mark.slow

K = LAB_CHECK_EVERY
DETAIL = K * math.ceil(DETAIL_EVERY / K)
ONSET = RankPlan(rank=0, world_size=2).onset
PG_TIMEOUT_S = 10.0

# fault, variant -> (onset: the first optimizer step whose result differs, what the first
# mismatch must include, first differing tensor)
STATE_FAULTS = {
    ("skipped-step", ""): (ONSET, {"param", "counter"}, "conv1.weight"),
    # the extra update is the bad rank's optimizer step ONSET + 1
    ("extra-step", ""): (ONSET + 1, {"param", "opt"}, "conv1.weight"),
    ("optimizer-state-mismatch", ""): (ONSET, {"param", "config"}, "conv1.weight"),
    # the reduction leaves the rank out from the iteration after step ONSET completed
    ("dropped-rank", ""): (ONSET + 1, {"param", "grad"}, "conv1.weight"),
    ("grad-accum-misaligned", "no_sync"): (ONSET, {"counter"}, None),
    ("init-mismatch", ""): (1, {"param"}, "conv1.weight"),
    ("mode-mismatch", ""): (1, {"mode"}, None),
    ("loss-hparam-mismatch", ""): (1, {"config"}, None),
}
CLEAN_RUNS = [(0, 2), (1, 2), (2, 2), (0, 4)]  # (seed, world size)
LAB_RUNS = [  # started ahead (tests/conftest.py)
    *({"fault": fault, "variant": variant} for fault, variant in STATE_FAULTS),
    *({"fault": fault} for fault in ("shard-overlap", "duplicate-rank-id", "buffer-divergence", "grad-sum")),
    {"fault": "fp16-overflow", "variant": "local_skip"},
    *({"fault": "clean", "seed": seed, "world_size": n} for seed, n in CLEAN_RUNS),
    *({"fault": fault} for fault in ("rank-crash", "comm-timeout")),
]


def mismatches(checks: list[dict]) -> list[dict]:
    return sorted((c for c in checks if c["status"] == "mismatch"), key=lambda c: (c["step"], c["rank"]))


@pytest.mark.parametrize(("fault", "variant"), list(STATE_FAULTS), ids=lambda v: v or "-")
def test_state_fault_onset_ranks_and_first_tensor(lab, fault: str, variant: str) -> None:
    onset, what, tensor = STATE_FAULTS[(fault, variant)]
    run = read_run(lab(fault, variant).out)
    bad = mismatches(run.checks)
    assert bad, f"{fault}: no mismatch reported"
    first = bad[0]
    assert onset <= first["step"] < onset + K, (fault, first["step"])
    # Parameters, counters, configuration and modes are compared at every check; reduced
    # gradients and optimizer state at the detailed ones, which follow within DETAIL steps.
    assert what - {"opt", "grad"} <= set(first["what"]), first["what"]
    assert what <= set().union(*(c["what"] for c in bad if c["step"] < first["step"] + DETAIL))
    # Two ranks: no majority to tell which one is odd, so both are named.
    assert first["ranks"] == [0, 1]
    assert {c["rank"] for c in bad if c["step"] == first["step"]} == {0, 1}  # every rank reports it
    named = [c["tensor"] for c in bad if c.get("tensor")]
    if tensor:
        assert named and named[0] == tensor
    else:
        assert not named


def test_no_sync_extra_micro_step_shows_only_in_the_counters(lab) -> None:
    run = read_run(lab("grad-accum-misaligned", "no_sync").out)
    micro = run.steps.filter(pl.col("step") >= ONSET).group_by("rank").agg(pl.col("micro").unique())
    per_rank = {r: sorted(m) for r, m in zip(micro["rank"], micro["micro"], strict=True)}
    assert per_rank == {0: [4], 1: [5]}
    first = mismatches(run.checks)[0]
    assert first["what"] == ["counter"]  # no tensor differs: parameters stayed bitwise equal
    assert first["detail"]["micro"] == [4, 5]


def test_duplicate_data_is_flagged_from_the_first_step(lab) -> None:
    for fault in ("shard-overlap", "duplicate-rank-id"):
        first = mismatches(read_run(lab(fault).out).checks)[0]
        assert first["step"] == 1 and first["what"] == ["data"] and first["ranks"] == [0, 1]


def test_local_overflow_skip_is_reported_within_k_of_the_first_disagreeing_skip(lab) -> None:
    run = read_run(lab("fp16-overflow", "local_skip").out)
    flags = run.steps.group_by("step").agg(
        pl.col("overflow").n_unique().alias("k"), pl.col("opt_steps").n_unique().alias("o")
    )
    parted = flags.filter((pl.col("k") > 1) | (pl.col("o") > 1))["step"].min()
    assert parted is not None
    first = mismatches(run.checks)[0]
    assert parted <= first["step"] < parted + K


def test_unsynchronised_buffers_are_noted_not_flagged(lab) -> None:
    checks = read_run(lab("buffer-divergence").out).checks
    assert any(c["detail"].get("buffers_differ_unsynced") for c in checks if c["status"] == "ok")
    assert not [c for c in checks if c["status"] == "mismatch" and "buffer" in c["what"]]


def test_summed_gradients_show_in_the_reduce_ratio(lab) -> None:
    """Averaging can never make the reduced norm exceed the mean local norm (triangle
    inequality); a sum over two ranks is twice the average. At step 1 both runs start
    from the same weights and data, so there the ratios differ by exactly the world size.
    Later measured steps follow two different trajectories, whose rounding differs from
    one CPU to another: there only the bound is compared."""
    clean, summed = (read_run(lab(fault).out) for fault in ("clean", "grad-sum"))

    def ratios(run: RunRecords, step: int) -> dict[int, float]:
        at = run.steps.filter((pl.col("step") == step) & pl.col("reduce_ratio").is_not_null())
        return dict(zip(at["rank"].to_list(), at["reduce_ratio"].to_list(), strict=True))

    first = ratios(clean, 1)
    assert set(first) == {0, 1}
    assert ratios(summed, 1) == pytest.approx({rank: 2 * r for rank, r in first.items()}, rel=1e-9)
    clean_excess, summed_excess = (Evidence(records=run).reduce.excess for run in (clean, summed))
    assert clean_excess is not None and summed_excess is not None
    assert clean_excess["steps"] >= 2 and clean_excess["above_one"] == 0 and clean_excess["median"] <= 1
    assert summed_excess["steps"] >= 2 and summed_excess["median"] > 1


# Three seeds at world size 2 and one at 4: the clean runs the doctor's healthy tests
# read too (tests/e2e/lab/test_diagnose.py); more seeds at 4 prove nothing new.
@pytest.mark.parametrize(("seed", "world_size"), CLEAN_RUNS)
def test_clean_runs_raise_no_mismatch(lab, world_size: int, seed: int) -> None:
    result = lab("clean", world_size=world_size, seed=seed)
    assert result.ok
    run = read_run(result.out)
    assert not [c for c in run.checks if c["status"] != "ok"]
    last = int(run.steps["step"].max())  # the lab trains whole epochs: 150 steps or a few more
    checks = 1 + last // K + (last % K > 0)  # step 1, every K-th, and the last steps at close
    assert sum(c["detail"]["checks"] for c in run.checks) == checks  # each read once
    blocks = math.ceil(checks / min(math.ceil(READ_EVERY_STEPS / K), MAX_BLOCK))
    assert {c["rank"] for c in run.checks} == {b % world_size for b in range(blocks)}  # the ranks read in turn
    assert set(run.ends) == set(range(world_size)) and not run.warnings


@pytest.mark.parametrize("fault", ["rank-crash", "comm-timeout"])
def test_a_failing_rank_never_makes_the_probe_hang(lab, fault: str) -> None:
    result = lab(fault)
    assert not result.timed_out
    run = read_run(result.out)
    for rank in (0, 1):
        ended = run.ends.get(rank)
        incomplete = [c for c in run.checks if c["rank"] == rank and c["status"] == "incomplete"]
        assert ended or incomplete, rank
    assert run.ends[1]["status"] == "exception"
    # Every step before the failure is on record for every rank.
    assert run.steps.filter(pl.col("rank") == 0)["step"].to_list() == list(range(1, ONSET))


def test_on_mismatch_raise_stops_every_rank_and_dumps_evidence(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("SYNCDOCTOR_ON_MISMATCH", "raise")
    # A fault that keeps the ranks' step counters aligned, so both reach the check that
    # reads the result (step 100 at K=10: the block of checks at steps 1-90 is read one check
    # after its last).
    result = run_lab(
        "optimizer-state-mismatch", world_size=2, steps=120, onset=12, out=tmp_path / "run", pg_timeout_s=PG_TIMEOUT_S
    )
    assert not result.timed_out and all(code not in (0, None) for code in result.exit_codes)
    for rank in (0, 1):
        log = (result.out / f"train.log{rank}").read_text()
        assert "SyncMismatchError: GRADIENT_SYNC: rank 0 and rank 1 parameter mismatch at step 20" in log
    bundles = sorted((result.out / "evidence").glob("step20.rank*.json"))
    assert len(bundles) == 2
    bundle = json.loads(bundles[1].read_text())
    assert bundle["ranks"] == [0, 1] and "param" in bundle["what"] and bundle["tensor"] == "conv1.weight"
    assert bundle["per_rank"]["opt_steps"] == [20, 20] and bundle["counters"]["step"] >= 30
    assert bundle["last_losses"] and None not in bundle["per_rank"]["loss"]
    run = read_run(result.out)
    assert {r for r, e in run.ends.items() if e["status"] == "exception"} == {0, 1}
