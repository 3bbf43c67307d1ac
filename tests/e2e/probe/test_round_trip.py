"""Probe → records → doctor without shortcuts: an ordinary DDP script with a real
DistributedSampler loader runs unmodified under `syncdoctor run -- torchrun`, and the
doctor reads what the probe wrote (no lab-made loader dict, no hand-built records)."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest

from syncdoctor.doctor.diagnose import diagnose
from syncdoctor.records import contract, read_run
from syncdoctor.settings import DEFAULT_CHECK_EVERY
from tests.e2e.probe.test_run_cli import torchrun_syncdoctor

pytestmark = pytest.mark.slow


# (script, ranks, check every, script arguments) of every run the tests below read,
# started ahead with the session's other launches (tests/conftest.py `launches`).
DDP = ("ddp_train.py", 2, 5)
LAUNCHES = [
    (*DDP, "--steps", "60"),
    ("ddp_train.py", 3, 5, "--steps", "30", "--odd-weight-decay-rank", "0"),
    (*DDP, "--steps", "30", "--odd-weight-decay-rank", "0"),
    (*DDP, "--steps", "20", "--nan-at", "1:12"),
    (*DDP, "--steps", "20", "--nan-at", "all:8"),
    (*DDP, "--steps", "23"),
    (*DDP, "--steps", "23", "--part-at", "1:22"),
    (*DDP, "--steps", "23", "--edit-after-training", "0"),
    (*DDP, "--steps", "23", "--resume-momentum-rank", "0"),
    (*DDP, "--steps", "110", "--scale-data-at", "0:32"),
    (*DDP, "--steps", "20", "--accumulate", "0:2"),
    (*DDP, "--steps", "20", "--accumulate", "2"),
    (*DDP, "--steps", "20", "--accumulate", "2", "--unsynced-every", "4"),
    (*DDP, "--steps", "20", "--clip", "0:0.05"),
    (*DDP, "--steps", "20", "--clip", "all:0.05"),
    (*DDP, "--steps", "20", "--clip", "0:inf"),
    ("rebuild_job.py", 2, DEFAULT_CHECK_EVERY),
    ("rebuild_job.py", 2, DEFAULT_CHECK_EVERY, "--load-on-rank0-only"),
    ("rebuild_job.py", 2, DEFAULT_CHECK_EVERY, "--resume-after-wrap"),
    ("rebuild_job.py", 2, DEFAULT_CHECK_EVERY, "--resume-after-wrap", "--load-on-rank0-only"),
    ("unfreeze_job.py", 2, 10),
    ("unfreeze_job.py", 2, 10, "--unfreeze-before-wrap"),
    ("unfreeze_job.py", 2, 10, "--unfreeze-before-wrap", "--learnable-temperature"),
    ("join_job.py", 2, 5),
    ("join_job.py", 2, 5, "--no-join"),
    ("hand_average_job.py", 2, 5),
    ("hand_average_job.py", 2, 5, "--write-back"),
    ("hand_average_job.py", 2, 5, "--write-back", "--noise-after-average"),
    ("hand_average_job.py", 2, 5, "--write-back", "--unreduced-every", "4"),
]


def launch(key: tuple, folder: Path) -> Path:
    script, nproc, check_every, *args = key
    out = folder / "run"
    proc = torchrun_syncdoctor(out, script, *args, nproc=nproc, extra=("--check-every", str(check_every)))
    if "--no-join" not in args:  # the one launch that must fail: a rank waits for one that left
        assert proc.returncode == 0, proc.stderr[-3000:]
    return out


@pytest.fixture
def torchrun(launched):
    return lambda *args, nproc=2: launched(("ddp_train.py", nproc, 5, *args))


def test_healthy_run_with_a_real_distributed_sampler(torchrun) -> None:
    out = torchrun("--steps", "60")
    run = read_run(out)
    for rank, snap in run.snapshots.items():
        loader = snap["loader"]
        assert loader["sampler"] == "DistributedSampler"
        assert loader["num_replicas"] == 2 and loader["rank"] == rank and loader["seed"] == 0
        assert snap["init_param_fp_before_update"] is True
    diag = diagnose([out])
    assert diag.verdict == "healthy", [(f.code, f.evidence) for f in diag.findings]
    # The live check kept confirming blocks to the end of the run.
    ok = [c for c in run.checks if c["status"] == "ok"]
    assert ok and max(c["step"] for c in ok) == 60
    covered = sorted((c["detail"]["first_step"], c["step"]) for c in ok)
    assert covered[0][0] == 1


def test_rank_dependent_weight_decay_is_the_optimizer_not_the_init(torchrun) -> None:
    # Three ranks, rank 0 odd: the weights DDP starts from are identical everywhere, the
    # first update already differs. A configuration seen different at start is the cause.
    out = torchrun("--steps", "30", "--odd-weight-decay-rank", "0", nproc=3)
    diag = diagnose([out])
    top = diag.findings[0]
    assert top.code == "SD601" and top.category == "optim.state_mismatch", [
        (f.code, f.confidence) for f in diag.findings
    ]
    assert top.ranks == [0]
    assert any("weight_decay 0 (ranks 1, 2) vs 0.01 (rank 0)" in line for line in top.evidence), top.evidence
    assert "SD501" not in {f.code for f in diag.findings}


def test_two_ranks_disagreeing_name_no_culprit(torchrun) -> None:
    out = torchrun("--steps", "30", "--odd-weight-decay-rank", "0")
    diag = diagnose([out])
    assert diag.findings[0].code == "SD601" and diag.findings[0].ranks == [0, 1]
    logs = "".join((out / "logs" / f"rank{r}.log").read_text() for r in (0, 1))
    assert "no majority to tell which side is odd" in logs
    assert "odd one out" not in logs


def test_nan_on_one_rank_survives_the_round_trip(torchrun) -> None:
    out = torchrun("--steps", "20", "--nan-at", "1:12")
    run = read_run(out)
    nan_rows = run.steps.filter(run.steps["loss"].is_nan())
    assert nan_rows.height and int(nan_rows["step"].min()) == 12
    diag = diagnose([out])
    assert diag.verdict != "healthy"
    nonfinite = next(f for f in diag.findings if f.code == "SD904")
    assert nonfinite.ranks == [1] and nonfinite.step == 12 and nonfinite.severity == "error"
    assert json.dumps(diag.to_json())  # the report stays serialisable with NaN in it


def test_nan_on_every_rank_is_not_healthy(torchrun) -> None:
    diag = diagnose([torchrun("--steps", "20", "--nan-at", "all:8")])
    assert diag.verdict != "healthy"
    assert any(f.code == "SD904" and f.step == 8 for f in diag.findings)


def _coverage(out: Path) -> list[str]:
    return diagnose([out]).coverage


def test_the_steps_after_the_last_check_step_are_compared_at_close(torchrun) -> None:
    """23 steps, a check every 5: steps 21-23 are compared once more when the run ends."""
    out = torchrun("--steps", "23")
    diag = diagnose([out])
    assert diag.verdict == "healthy"
    assert diag.coverage == ["replicas compared at 6 checks, steps 1-23"]
    assert max(c["step"] for c in read_run(out).checks if c["status"] == "ok") == 23


def test_replicas_that_part_after_the_last_check_step_are_caught_at_close(torchrun) -> None:
    out = torchrun("--steps", "23", "--part-at", "1:22")
    diag = diagnose([out])
    assert diag.verdict == "sync_problem"
    mismatch = [c for c in read_run(out).checks if c["status"] == "mismatch"]
    assert mismatch and mismatch[0]["step"] == 23 and mismatch[0]["tensor"] == "fc.bias"


def test_weights_changed_on_one_rank_after_training_are_no_mismatch(torchrun) -> None:
    """Near miss: rank 0 edits its weights after the last step (a checkpoint loaded for
    its own evaluation). Nothing is compared at close, and the verdict says why."""
    out = torchrun("--steps", "23", "--edit-after-training", "0")
    diag = diagnose([out])
    assert diag.verdict == "healthy", [(f.code, f.evidence) for f in diag.findings]
    assert not [c for c in read_run(out).checks if c["status"] == "mismatch"]
    assert "steps 21-23 ran after the last check and were not compared" in diag.coverage[1]
    assert "the parameters changed after the last step on 1 of 2 ranks" in diag.coverage[1]


@pytest.mark.parametrize("fault", [False, True])
def test_a_model_rebuilt_in_the_same_process_is_the_same_replicas_next_segment(launched, fault: bool) -> None:
    """Train, checkpoint, rebuild model, DDP and optimizer, load, resume (scripts/
    rebuild_job.py): one record per rank whose steps go on counting, healthy; with the
    checkpoint loaded on rank 0 only, the rebuild is named (SD505), not a flipped bit
    nor an incomplete all-reduce."""
    out = launched(("rebuild_job.py", 2, DEFAULT_CHECK_EVERY, *(["--load-on-rank0-only"] if fault else [])))
    run = read_run(out)
    for rank in (0, 1):
        steps = run.steps.filter(run.steps["rank"] == rank)["step"].to_list()
        assert steps == list(range(1, 61))  # one series: no step counted twice
    assert run.snapshots[0].get("segment") == 2
    diag = diagnose([out])
    if fault:
        assert diag.verdict == "sync_problem" and diag.findings[0].code == "SD505", [f.code for f in diag.findings]
        assert diag.findings[0].step == 31
    else:
        assert diag.verdict == "healthy", [(f.code, f.evidence) for f in diag.findings]


@pytest.mark.parametrize("fault", [False, True])
def test_weights_loaded_after_the_wrap_on_one_rank_are_an_init_mismatch(launched, fault: bool) -> None:
    """Pretrained weights loaded after DDP's constructor broadcast (scripts/rebuild_job.py
    --resume-after-wrap): on every rank healthy; on rank 0 only the replicas differ before
    their first update although the wrap made them equal, which the probe sees at the
    first optimizer step (SD501), not as a state that parted at the first update."""
    flags = ["--resume-after-wrap", *(["--load-on-rank0-only"] if fault else [])]
    out = launched(("rebuild_job.py", 2, DEFAULT_CHECK_EVERY, *flags))
    diag = diagnose([out])
    if not fault:
        assert diag.verdict == "healthy", [(f.code, f.evidence) for f in diag.findings]
        return
    top = diag.findings[0]
    assert (top.code, top.category, top.step) == ("SD501", "model.init_mismatch", 0), [f.code for f in diag.findings]
    assert any("changed on rank 0 before the first update" in line for line in top.evidence), top.evidence
    assert read_run(out).snapshots[0].get("init_params_changed") is True
    assert "init_params_changed" not in read_run(out).snapshots[1]


@pytest.mark.parametrize("before_wrap", [False, True])
def test_a_backbone_unfrozen_after_the_wrap_is_named_as_gradients_no_all_reduce_covers(
    launched, before_wrap: bool
) -> None:
    """scripts/unfreeze_job.py: frozen when DDP is built, unfrozen at step 12: the
    probe sees gradients outside the reducer's parameters at the next check (SD409),
    not a canary or a flipped bit; unfrozen before the wrap it is healthy."""
    out = launched(("unfreeze_job.py", 2, 10, *(["--unfreeze-before-wrap"] if before_wrap else [])))
    diag = diagnose([out])
    if before_wrap:
        assert diag.verdict == "healthy", [(f.code, f.evidence) for f in diag.findings]
    else:
        top = diag.findings[0]
        assert (top.code, top.step, top.tensor) == ("SD409", 20, "0.weight"), [f.code for f in diag.findings]


def test_a_learnable_loss_weight_outside_the_wrapped_model_is_named_as_gradients_no_all_reduce_covers(
    launched,
) -> None:
    """scripts/unfreeze_job.py --learnable-temperature: the optimizer updates a
    temperature that is not in the module DDP wraps; its gradient is each rank's own
    from the first step (SD409, the parameter named by its place in the optimizer)."""
    out = launched(("unfreeze_job.py", 2, 10, "--unfreeze-before-wrap", "--learnable-temperature"))
    top = diagnose([out]).findings[0]
    assert (top.code, top.step, top.tensor) == ("SD409", 1, "optimizer group 0 parameter 6 ()"), top


def test_uneven_inputs_under_join_are_healthy_and_the_join_is_recorded(launched) -> None:
    """scripts/join_job.py: rank 0 runs 24 steps and rank 1 20, under torch's Join (the
    documented recipe for uneven inputs): every rank's record says it joined, and the
    different step counts are not reported as uneven shards."""
    out = launched(("join_job.py", 2, 5))
    run = read_run(out)
    assert {e["rank"] for e in run.events if e.get("event") == contract.JOIN_EVENT} == {0, 1}
    diag = diagnose([out])
    assert diag.verdict == "healthy", [(f.code, f.evidence) for f in diag.findings]


@pytest.mark.parametrize("write_back", [False, True])
def test_a_hand_written_average_that_drops_a_missing_gradient_is_named_at_the_backward(
    launched, write_back: bool
) -> None:
    """scripts/hand_average_job.py: a head some batches skip keeps no gradient on the
    ranks that skipped it (the average reduced a zero stand-in and dropped it): the
    ranks update different parameters (SD410, the head named), and the write counts
    that differ for that reason are not blamed on code outside the update (SD507).
    With the reduced tensor written back it is healthy."""
    out = launched(("hand_average_job.py", 2, 5, *(["--write-back"] if write_back else [])))
    diag = diagnose([out])
    if write_back:
        assert diag.verdict == "healthy", [(f.code, f.evidence) for f in diag.findings]
        return
    top = diag.findings[0]
    assert (top.code, top.category, top.ranks, top.step) == ("SD410", "sync.incomplete_reduce", [0], 1), top
    assert top.tensor is not None and top.tensor.startswith("rare_head.")
    assert "SD507" not in {f.code for f in diag.findings}


@pytest.mark.parametrize("noise", [False, True])
def test_a_hand_written_all_reduce_is_observed_where_it_returns(launched, noise: bool) -> None:
    """scripts/hand_average_job.py --write-back: no DDP wrapper, the reduce is the
    script's own dist.all_reduce of each gradient. The probe fingerprints what each
    call returned (grad_reduced_fp, equal on both ranks at the detailed checks). With
    noise drawn per rank after the average, the gradients at the update differ: the
    cause is what came after the all-reduce (SD412), not the reduce op (SD403: the
    update's gradients are larger than the local ones, but a sum would be one tensor on
    every rank) and not an incomplete reduce."""
    out = launched(("hand_average_job.py", 2, 5, "--write-back", *(["--noise-after-average"] if noise else [])))
    steps = read_run(out).steps
    reduced = steps.filter(steps["grad_reduced_fp"].is_not_null())
    assert reduced.height >= 2, "no hand-written reduce observed"
    per_check = reduced.group_by("step").agg(pl.col("grad_reduced_fp").n_unique().alias("k"), pl.len().alias("n"))
    assert per_check["k"].to_list() == [1] * per_check.height and set(per_check["n"]) == {2}
    # Every update followed the loop's all_reduce of each gradient: none is counted unreduced.
    assert "unsynced_updates" not in steps.columns or steps["unsynced_updates"].null_count() == steps.height
    diag = diagnose([out])
    if not noise:
        assert diag.verdict == "healthy", [(f.code, f.evidence) for f in diag.findings]
        return
    top = diag.findings[0]
    assert (top.code, top.category, top.stage) == ("SD412", "optim.state_mismatch", "grads_at_update"), [
        (f.code, f.evidence) for f in diag.findings
    ]
    assert any("same gradient right after the all-reduce" in line for line in top.evidence)
    assert "SD403" not in {f.code for f in diag.findings}


def test_a_hand_written_loop_phase_that_steps_without_its_all_reduce_is_named(launched) -> None:
    """scripts/hand_average_job.py --write-back --unreduced-every 4: no DDP wrapper; after
    every 4th update a penalty phase (StyleGAN2's lazy regularisation in shape) calls
    backward() and step() without the loop's all_reduce. The probe counts those updates
    (no all_reduce of a gradient since the previous update, in a loop that reduced before
    an earlier one: the first at step 5, then every 5th update) and SD413 names the
    missing reduce, not the optimizer state that parts as a result. Its twin without the
    option is healthy and counts none (the test above)."""
    out = launched(("hand_average_job.py", 2, 5, "--write-back", "--unreduced-every", "4"))
    checks = read_run(out).steps.filter(pl.col("param_fp").is_not_null() & (pl.col("step") >= 5))
    assert set(checks["unsynced_first"].to_list()) == {5}
    assert set(checks["unsynced_how"].to_list()) == {"no_all_reduce"}
    assert checks.filter(pl.col("step") == 20)["unsynced_updates"].to_list() == [4, 4]
    diag = diagnose([out])
    top = diag.findings[0]
    assert (top.code, top.category, top.stage, top.step, top.ranks) == (
        "SD413",
        "sync.incomplete_reduce",
        "sync_schedule",
        5,
        [],
    ), [(f.code, f.evidence) for f in diag.findings]
    assert any("no all_reduce call of a gradient" in line for line in top.evidence)


def test_an_optimizer_state_resumed_on_one_rank_is_named_at_the_first_check(torchrun) -> None:
    """ddp_train.py --resume-momentum-rank 0: the weights agree before the first update
    and the reduced gradients agree at step 1, the parameters and the optimizer state do
    not: the optimizer state (SD601), not a canary divergence or an init mismatch."""
    diag = diagnose([torchrun("--steps", "23", "--resume-momentum-rank", "0")])
    top = diag.findings[0]
    assert (top.code, top.category, top.step) == ("SD601", "optim.state_mismatch", 1), [f.code for f in diag.findings]


@pytest.mark.parametrize("accumulate", ["0:2", "2"])
def test_a_sync_schedule_that_differs_across_ranks_is_named_at_the_backward(torchrun, accumulate: str) -> None:
    """ddp_train.py --accumulate 0:2: rank 0 alone accumulates two micro-steps under
    no_sync. The probe records each update's sync schedule per backward call ("ns" on
    rank 0, one synchronised call on rank 1): SD411 names the first call where they
    differ. --accumulate 2 (every rank alike) records "ns" everywhere and is healthy."""
    out = torchrun("--steps", "20", "--accumulate", accumulate)
    run = read_run(out)
    at_check = run.steps.filter(run.steps["param_fp"].is_not_null() & (run.steps["step"] == 5))
    schedules = set(zip(at_check["rank"].to_list(), at_check["syncs"].to_list(), strict=True))
    diag = diagnose([out])
    if accumulate == "2":
        assert schedules == {(0, "ns"), (1, "ns")}
        assert diag.verdict == "healthy", [(f.code, f.evidence) for f in diag.findings]
        return
    assert schedules == {(0, "ns"), (1, None)}  # one synchronised call: absent
    top = diag.findings[0]
    assert (top.code, top.category, top.step, top.ranks) == ("SD411", "sync.step_misalignment", 1, [0, 1]), top
    assert "backward call 1 of update 1" in top.evidence[0]


def test_weights_changed_through_data_outside_the_update_are_named_there(torchrun) -> None:
    """ddp_train.py --scale-data-at 0:32: rank 0 scales its weights through p.data after
    update 32 (EMA weights copied in and not restored). torch's version counters do not
    count such writes, so the write counts agree (no SD507); at the next detailed check
    (step 100) the reduced gradients and the optimizer state agree while the weights do
    not: SD508 names a change outside the update, not the optimizer (SD601) and not a
    flipped bit (every tensor changed), and says what the sparse checks cannot rule out."""
    out = torchrun("--steps", "110", "--scale-data-at", "0:32")
    checks = read_run(out).steps.filter(pl.col("param_writes").is_not_null())
    assert checks.group_by("step").agg(pl.col("param_writes").n_unique())["param_writes"].max() == 1
    diag = diagnose([out])
    top = diag.findings[0]
    assert (top.code, top.category, top.stage, top.step) == ("SD508", "model.init_mismatch", "params", 35), top
    assert any("--check-every 1" in line for line in top.evidence)
    assert not {"SD601", "SD971", "SD507"} & {f.code for f in diag.findings}


def test_a_weight_given_new_storage_on_one_rank_is_named_at_the_bindings(torchrun) -> None:
    """ddp_train.py --rebind-at 0:12: rank 0 prunes fc.weight of the training model after
    update 12 through `p.data = ...` (what prune.remove does in a rank-0 export). The
    parameter is the same object, its version counter unchanged (no SD507), and only that
    tensor parts, which looked like a flipped bit (SD971). The probe sees the new storage
    at the next check (params_rebound on rank 0 only): SD509 names rank 0, step 15 and
    fc.weight, at the live bindings, and SD971 stands down."""
    out = torchrun("--steps", "23", "--rebind-at", "0:12")
    checks = read_run(out).steps.filter(pl.col("param_fp").is_not_null() & (pl.col("step") >= 10))
    seen = {(r, s): n for r, s, n in checks.select("rank", "step", "params_rebound").iter_rows()}
    assert seen[(0, 10)] is None and seen[(0, 15)] == 1 and seen[(1, 15)] is None, seen
    diag = diagnose([out])
    top = diag.findings[0]
    assert (top.code, top.category, top.stage, top.ranks, top.step, top.tensor) == (
        "SD509",
        "model.init_mismatch",
        "bindings",
        [0],
        15,
        "fc.weight",
    ), top
    assert not {"SD971", "SD507"} & {f.code for f in diag.findings}


def test_an_update_that_read_unaveraged_gradients_on_every_rank_is_named(torchrun) -> None:
    """ddp_train.py --accumulate 2 --unsynced-every 4: every 4th update's last micro-step
    also runs inside no_sync on both ranks. The schedules agree ("nn" everywhere: no
    SD411, no hang), but those updates read each rank's own gradient: the probe counts
    them (unsynced_updates, first at step 4) and SD413 names the sync schedule, not the
    optimizer. Its twin, --accumulate 2 alone, is healthy (the test above)."""
    out = torchrun("--steps", "20", "--accumulate", "2", "--unsynced-every", "4")
    checks = read_run(out).steps.filter(pl.col("param_fp").is_not_null() & (pl.col("step") >= 5))
    assert set(checks["unsynced_first"].to_list()) == {4}
    assert set(checks["unsynced_how"].to_list()) == {"no_sync"}
    assert checks.filter(pl.col("step") == 20)["unsynced_updates"].to_list() == [5, 5]
    top = diagnose([out]).findings[0]
    assert (top.code, top.category, top.stage, top.step, top.ranks) == (
        "SD413",
        "sync.incomplete_reduce",
        "sync_schedule",
        4,
        [],
    )


@pytest.mark.parametrize("clip", ["0:0.05", "all:0.05", "0:inf"])
def test_gradients_changed_between_the_all_reduce_and_the_update_are_named_there(torchrun, clip: str) -> None:
    """ddp_train.py --clip 0:0.05: rank 0 alone clips the averaged gradients. The probe
    fingerprints them right after the synchronised backward() returned (equal on both
    ranks) and at the update (apart), and counts the in-place writes into them in
    between (clip_grad_norm_ writes each of the 6 tensors once, on rank 0 only): SD412
    names the stage between the two, and the all-reduce is not blamed. --clip all:0.05
    (every rank clips) is healthy. --clip 0:inf (rank 0 alone calls clip_grad_norm_ to
    read the norm: it writes, but changes no value) stays healthy, with SD412 as a note."""
    out = torchrun("--steps", "20", "--clip", clip)
    steps = read_run(out).steps
    first = steps.filter(pl.col("step") == 1).sort("rank")
    assert first["grad_reduced_fp"].n_unique() == 1 and first["grad_reduced_fp"].null_count() == 0
    writes = steps.filter(pl.col("param_fp").is_not_null()).group_by("rank").agg(pl.col("grad_writes").unique())
    diag = diagnose([out])
    if clip == "0:inf":
        assert sorted(writes.rows()) == [(0, [6]), (1, [0])]
        assert diag.verdict == "healthy", [(f.code, f.evidence) for f in diag.findings]
        note = [f for f in diag.findings if f.code == "SD412"]
        assert note and note[0].severity == "info" and "have not parted" in " ".join(note[0].evidence)
        return
    if clip.startswith("all"):
        assert first["grad_fp"].n_unique() == 1
        assert sorted(writes.rows()) == [(0, [6]), (1, [6])]
        assert diag.verdict == "healthy", [(f.code, f.evidence) for f in diag.findings]
        return
    assert first["grad_fp"].n_unique() == 2
    assert sorted(writes.rows()) == [(0, [6]), (1, [0])]
    top = diag.findings[0]
    assert (top.code, top.category, top.stage, top.step) == ("SD412", "optim.state_mismatch", "grads_at_update", 1)
    assert "SD401" not in [f.code for f in diag.findings]


def test_uneven_inputs_without_join_are_named_as_updates_the_ranks_did_not_share(launched) -> None:
    """join_job.py --no-join: rank 1 runs out of batches after update 20 and leaves;
    rank 0 is then inside update 21's synchronised backward and fails waiting for it.
    The end records say so (SD402, rank 0 named), and the closed connection is not the
    cause (SD951 below it)."""
    diag = diagnose([launched(("join_job.py", 2, 5, "--no-join"))])
    top = diag.findings[0]
    assert (top.code, top.category, top.step, top.ranks) == ("SD402", "sync.step_misalignment", 21, [0]), [
        (f.code, f.confidence, f.evidence) for f in diag.findings
    ]
    assert "inside update 21" in " ".join(top.evidence)
