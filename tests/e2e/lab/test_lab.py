"""The lab reproduces each fault for real: every fault produces the state change it
claims, the clean baseline keeps replicas bitwise identical, and no process
outlives its run."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import polars as pl
import pytest

from syncdoctor.cli import main
from syncdoctor.lab.faults import FAULTS
from syncdoctor.lab.matrix import cases
from syncdoctor.records import read_run
from tests.conftest import pids_running_with

REQUIRED_FAULTS = {
    "unseeded-shuffle",
    "shuffle-after-shard",
    "shard-overlap",
    "uneven-shards",
    "duplicate-rank-id",
    "dropped-rank",
    "grad-accum-misaligned",
    "skipped-step",
    "extra-step",
    "loss-hparam-mismatch",
    "grad-sum",
    "optimizer-state-mismatch",
    "init-mismatch",
    "mode-mismatch",
    "buffer-divergence",
    "fp16-overflow",
    "lr-not-scaled",
    "rank-crash",
    "comm-timeout",
}
# Started ahead (tests/conftest.py): the matrix's runs at seed 0 but the bit flips, and the
# runs only this file reads.
LAB_RUNS = [
    {"fault": "clean", "check_every": 1},
    *({"fault": f, "variant": v} for f, v, seed in cases() if seed == 0 and f != "bit-flip"),
    *({"fault": fault, "world_size": 4} for fault in ("clean", "dropped-rank", "rank-crash")),
]


def steps_of(result) -> pl.DataFrame:
    return read_run(result.out).steps


def differing_steps(steps: pl.DataFrame, column: str) -> list[int]:
    """Steps at which `column` is not the same on every rank."""
    per = (
        steps.filter(pl.col(column).is_not_null())
        .group_by("step")
        .agg(pl.col(column).n_unique().alias("k"), pl.len().alias("n"))
    )
    return sorted(per.filter((pl.col("k") > 1) & (pl.col("n") > 1))["step"].to_list())


def test_list_json_has_every_fault_with_its_measured_effect(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["lab", "list", "--json"]) == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    assert set(rows) >= REQUIRED_FAULTS
    for row in rows.values():
        assert row["description"] and row["symptom"] and row["category"]
        assert row["measured"] and row["measured"] != "not measured yet", row["name"]
    assert set(rows["grad-accum-misaligned"]["variants"]) == {"no_sync", "extra_update"}
    assert set(rows["fp16-overflow"]["variants"]) == {"no_scaling", "local_skip"}


def test_clean_baseline_is_bitwise_identical_at_every_step_and_learns(lab) -> None:
    result = lab("clean", check_every=1)
    assert result.ok
    assert min(result.accuracy.values()) >= 0.90
    steps = steps_of(result)
    assert steps["param_fp"].null_count() == 0  # fingerprinted at every step
    for column in ("param_fp", "opt_fp", "grad_fp", "micro", "opt_steps"):
        assert differing_steps(steps, column) == [], column
    loss = steps.group_by("step").agg(pl.col("loss").mean()).sort("step")["loss"]
    assert loss.head(10).mean() > 3 * loss.tail(10).mean()  # smoothly down, not just noise


def test_clean_baseline_at_world_size_4(lab) -> None:
    result = lab("clean", world_size=4)
    assert result.ok and len(result.exit_codes) == 4
    assert min(result.accuracy.values()) >= 0.90
    assert differing_steps(steps_of(result), "param_fp") == []


def test_per_rank_training_logs_look_like_real_ones(lab) -> None:
    result = lab("clean")
    for rank in range(2):
        text = (result.out / f"train.log{rank}").read_text()
        assert f"| rank {rank} | epoch 1 | step 1 | loss " in text
        assert "held-out accuracy" in text


@pytest.mark.parametrize("fault", ["dropped-rank", "skipped-step", "extra-step", "optimizer-state-mismatch"])
def test_replicas_part_only_after_the_onset(lab, fault: str) -> None:
    result = lab(fault)
    parted = differing_steps(steps_of(result), "param_fp")
    assert parted, "the fault must change the parameters"
    assert 40 <= parted[0] <= 50  # onset 40, fingerprints every 10 steps


def test_init_mismatch_replicas_differ_from_the_first_step(lab) -> None:
    parted = differing_steps(steps_of(lab("init-mismatch")), "param_fp")
    assert parted and parted[0] == 1


def test_skipped_and_extra_steps_change_the_optimizer_step_count(lab) -> None:
    for fault in ("skipped-step", "extra-step"):
        steps = steps_of(lab(fault))
        last = steps.group_by("rank").agg(pl.col("opt_steps").max())
        assert last["opt_steps"].n_unique() == 2, fault


def test_no_sync_extra_micro_step_is_silent_except_for_counters(lab) -> None:
    steps = steps_of(lab("grad-accum-misaligned", "no_sync"))
    before_end = steps.filter(pl.col("step") < 100)
    assert differing_steps(before_end, "param_fp") == []  # facts: no tensor changes
    micro = before_end.filter(pl.col("step") > 40).group_by("rank").agg(pl.col("micro").mode().first())
    assert sorted(micro["micro"].to_list()) == [4, 5]


def test_extra_update_variant_misaligns_collectives(lab) -> None:
    result = lab("grad-accum-misaligned", "extra_update")
    assert differing_steps(steps_of(result), "backward")
    assert any(code != 0 for code in result.exit_codes)  # one collective more: the job fails at the end


def test_data_faults_change_what_ranks_read(lab) -> None:
    overlap = steps_of(lab("shard-overlap"))
    assert differing_steps(overlap, "data_fp") == []  # identical batches on every rank
    duplicate = steps_of(lab("duplicate-rank-id"))
    assert differing_steps(duplicate, "data_fp") == []
    unseeded = steps_of(lab("unseeded-shuffle"))
    first_epoch = unseeded.filter(pl.col("step") <= 22)
    ids = {r: set(g["ids"].explode().to_list()) for (r,), g in first_epoch.group_by(["rank"])}
    assert ids[0] & ids[1], "without a common seed the shards overlap"
    clean = steps_of(lab("clean")).filter(pl.col("step") <= 22)
    clean_ids = {r: set(g["ids"].explode().to_list()) for (r,), g in clean.group_by(["rank"])}
    assert not clean_ids[0] & clean_ids[1]


def _epoch_overlap(result, rank: int = 0, epoch_steps: int = 22) -> float:
    """Jaccard overlap of the sample ids a rank read in epoch 1 and in epoch 2."""
    steps = steps_of(result).filter(pl.col("rank") == rank)
    first = set(steps.filter(pl.col("step") <= epoch_steps)["ids"].explode().to_list())
    second = steps.filter((pl.col("step") > epoch_steps) & (pl.col("step") <= 2 * epoch_steps))
    second_ids = set(second["ids"].explode().to_list())
    return len(first & second_ids) / len(first | second_ids)


def test_shuffle_after_shard_reads_a_fixed_subset_each_epoch(lab) -> None:
    assert _epoch_overlap(lab("shuffle-after-shard")) > 0.95  # drop_last trims a few samples
    assert _epoch_overlap(lab("clean")) < 0.7  # a global shuffle deals a new half each epoch


def test_uneven_shards_give_different_batch_sizes_and_end_in_error(lab) -> None:
    result = lab("uneven-shards")
    steps = steps_of(result)
    assert differing_steps(steps, "samples")
    assert any(code != 0 for code in result.exit_codes)


def test_loss_hparam_mismatch_keeps_replicas_but_not_losses(lab) -> None:
    result = lab("loss-hparam-mismatch")
    run = read_run(result.out)
    margins = {r: s["loss"]["params"]["margin"] for r, s in run.snapshots.items()}
    assert margins == {0: 0.05, 1: 0.1}
    assert differing_steps(run.steps, "param_fp") == []


def test_grad_sum_makes_the_reduced_norm_exceed_the_local_ones(lab) -> None:
    steps = steps_of(lab("grad-sum")).filter(pl.col("grad_norm_local").is_not_null())
    per = steps.group_by("step").agg((pl.col("grad_norm").median() / pl.col("grad_norm_local").mean()).alias("r"))
    assert (per["r"] > 1.05).mean() > 0.5
    clean = steps_of(lab("clean")).filter(pl.col("grad_norm_local").is_not_null())
    per = clean.group_by("step").agg((pl.col("grad_norm").median() / pl.col("grad_norm_local").mean()).alias("r"))
    assert (per["r"] <= 1.0 + 1e-9).all()


def test_mode_and_buffer_faults(lab) -> None:
    assert differing_steps(steps_of(lab("mode-mismatch")), "train_mode")
    checks = read_run(lab("buffer-divergence").out).checks
    assert any(c.get("detail", {}).get("buffers_differ_unsynced") for c in checks)


def test_fp16_local_skip_makes_ranks_disagree_on_overflow(lab) -> None:
    steps = steps_of(lab("fp16-overflow", "local_skip"))
    per = steps.group_by("step").agg(pl.col("overflow").sum().alias("k"), pl.len().alias("n"))
    assert per.filter((pl.col("k") > 0) & (pl.col("k") < pl.col("n"))).height > 0
    assert differing_steps(steps, "param_fp")


def test_learning_rate_faults(lab) -> None:
    snapshot = read_run(lab("lr-not-scaled").out).snapshots[0]
    assert snapshot["optimizer"]["param_groups"][0]["lr"] == snapshot["baseline"]["lr"]
    diverged = lab("lr-too-high")
    assert max(diverged.accuracy.values()) < 0.5
    assert differing_steps(steps_of(diverged), "param_fp") == []  # in lockstep: not a sync problem


def test_rank_crash_ends_every_rank_with_the_real_errors_in_bounded_time(lab) -> None:
    result = lab("rank-crash")
    assert all(code not in (0, None) for code in result.exit_codes)
    assert not result.timed_out
    crashed = (result.out / "train.log1").read_text()
    assert "can't allocate memory" in crashed
    survivor = (result.out / "train.log0").read_text()
    # gloo's words for the lost peer depend on which wait noticed it first (on a loaded
    # machine its own timeout can close the pair before the closed socket is seen).
    assert any(
        words in survivor
        for words in ("Connection closed by peer", "Connection reset", "Application timeout caused pair closure")
    ), survivor[-2000:]


def test_comm_timeout_produces_the_real_timeout_error(lab) -> None:
    result = lab("comm-timeout")
    assert not result.timed_out
    assert all(code not in (0, None) for code in result.exit_codes)
    survivor = (result.out / "train.log0").read_text()
    # gloo words a collective timeout either way, depending on where the wait was.
    assert "timed out" in survivor.lower() or "Application timeout" in survivor


@pytest.mark.parametrize("fault", ["rank-crash", "comm-timeout", "uneven-shards", "dropped-rank"])
def test_no_process_is_left_behind(lab, fault: str) -> None:
    result = lab(fault)
    assert pids_running_with(str(result.out)) == []


@pytest.mark.parametrize("fault", ["dropped-rank", "rank-crash"])
def test_faults_run_at_world_size_4(lab, fault: str) -> None:
    result = lab(fault, world_size=4)
    assert len(result.exit_codes) == 4
    assert all((result.out / f"train.log{r}").stat().st_size > 0 for r in range(4))
    assert pids_running_with(str(result.out)) == []


@pytest.mark.slow
def test_an_interrupted_run_leaves_no_process(tmp_path) -> None:
    out = tmp_path / "interrupted"
    code = f"from syncdoctor.lab.runner import run_lab; run_lab('clean', world_size=2, steps=2000, out={str(out)!r})"
    proc = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and "| step 5 |" not in _read(out / "train.log0"):
        time.sleep(0.2)
    assert pids_running_with(str(out)), "the ranks should be running"
    proc.send_signal(signal.SIGINT)  # Ctrl-C
    proc.wait(timeout=30)
    time.sleep(0.5)
    assert pids_running_with(str(out)) == []


def _read(path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def test_every_fault_names_a_known_doctor_category() -> None:
    from syncdoctor.doctor.model import CATEGORIES

    assert all(f.category in CATEGORIES for f in FAULTS.values())
