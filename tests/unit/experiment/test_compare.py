"""The verdict lines from measures (the measures themselves come from real runs in
test_experiment_lab.py)."""

from __future__ import annotations

from syncdoctor.experiment.compare import Measures, compare


def _m(name: str, **kw) -> Measures:
    kw.setdefault("steps", 50)
    kw.setdefault("replicas_agree", True)
    kw.setdefault("verdict", "healthy")
    kw.setdefault("applied", None if name in ("control", "single") else True)
    return Measures(name, f"/x/{name}", **kw)


def test_replica_mismatch_removed_by_seeds_and_broadcast_means_init() -> None:
    bad = {"replicas_agree": False, "first_mismatch_step": 1, "verdict": "sync_problem", "top_code": "SD501"}
    result = compare(_m("control", **bad), [_m("seeds"), _m("broadcast"), _m("modes", **bad)])
    assert result.removed == {
        "seeds": ["replica_mismatch", "cause:SD501"],
        "broadcast": ["replica_mismatch", "cause:SD501"],
        "modes": [],
    }
    assert any(
        line.startswith("seeds, broadcast remove the replica mismatch → the replicas start different (init)")
        for line in result.verdict
    ), result.verdict


def test_a_clean_control_has_nothing_to_explain() -> None:
    result = compare(_m("control"), [_m("seeds"), _m("single", replicas_agree=None)])
    assert result.verdict == ["no anomaly in the control run: nothing to explain; no variant changed anything"]


def test_the_same_blowup_on_one_rank_is_not_the_parallel_part() -> None:
    blown = {"blowup": True, "verdict": "not_sync_problem", "top_code": "SD101", "top_category": "train.divergence"}
    result = compare(_m("control", **blown), [_m("single", replicas_agree=None, **blown)])
    assert result.verdict[0].startswith("the single-rank baseline shows the same blow-up: not the parallel part")
    assert result.removed == {"single": []}


def test_variants_not_applied_or_not_reported_are_not_credited() -> None:
    bad = {"replicas_agree": False, "first_mismatch_step": 1}
    result = compare(
        _m("control", **bad),
        [_m("seeds", applied=None), _m("broadcast", applied=False, how="no DDP"), _m("single", ran=False, how="x")],
    )
    assert result.removed == {}
    assert "no variant removes the replica mismatch" in result.verdict
    assert "broadcast: not applied: no DDP" in result.verdict
    assert "single: not applied: x" in result.verdict
    assert any("seeds: not reported" in line for line in result.verdict)


def test_a_variant_that_trades_the_anomaly_for_another_is_not_credited() -> None:
    # Seen on a Hugging Face Trainer run: the loss offset's cause gone, the replicas parted.
    offset = {"offsets": {1: 0.2}, "verdict": "sync_problem", "top_code": "SD701", "top_title": "loss"}
    traded = {"offsets": {1: 0.2}, "replicas_agree": False, "verdict": "sync_problem", "top_code": "SD601"}
    result = compare(_m("control", **offset), [_m("hparams", **traded), _m("seeds", **offset)])
    assert result.added == {"hparams": ["replica_mismatch"]}
    assert not any(line.startswith("hparams removes") and "→" in line for line in result.verdict), result.verdict
    assert any(
        "hparams removes the doctor's top cause" in line and "not an explanation" in line for line in result.verdict
    )
    assert "no variant removes the doctor's top cause (SD701: loss)" in result.verdict
