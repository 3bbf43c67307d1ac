"""`diagnose RUN --baseline BASELINE`: every verdict fires where its situation is
built and stays silent elsewhere. Record folders are written with the probe's real
writer; logs are plain text files the ingest reads."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from syncdoctor.cli import main
from syncdoctor.doctor.diagnose import diagnose
from syncdoctor.doctor.report import render_html, render_json
from syncdoctor.errors import InputError
from syncdoctor.records.writer import RecordWriter

STEPS = 60


def healthy(steps: int = STEPS, seed: int = 0, per_step: float = 1.0) -> list[float]:
    """A decreasing loss with 5 % multiplicative mini-batch noise; ``per_step`` is
    how much training one step does (2.0: a step of twice the global batch)."""
    rng = np.random.default_rng(seed)
    s = np.arange(1, steps + 1) * per_step
    return (2.0 * np.exp(-s / 30) + 0.1) * (1 + 0.05 * rng.standard_normal(steps))


def blowing_up(steps: int = STEPS, seed: int = 0) -> list[float]:
    rng = np.random.default_rng(seed)
    s = np.arange(1, steps + 1)
    return 1.0 * np.exp(s / 12) * (1 + 0.05 * rng.standard_normal(steps))


def write_run(root: Path, losses: dict[int, list[float]], batch: int = 32) -> Path:
    """A probe run folder: one snapshot, the step records and an end per rank."""
    world = len(losses)
    for rank, values in losses.items():
        writer = RecordWriter(root, rank)
        writer.write(
            "snapshot",
            rank=rank,
            world_size=world,
            framework="torch",
            global_batch=batch * world,
            loader={"batch_size": batch},
        )
        for step, loss in enumerate(values, 1):
            writer.step(step, 1, step, step, 1000.0 + step, float(loss), 0.1)
        writer.write("end", rank=rank, step=len(values), t=2000.0, status="ok", message="")
        writer.close()
    return root


def write_log(path: Path, values: list[float]) -> Path:
    path.write_text("".join(f"step {s} loss {v:.6f}\n" for s, v in enumerate(values, 1)))
    return path


def test_two_healthy_runs_agree_by_samples(tmp_path: Path) -> None:
    # Two ranks of batch 32 do per step what one rank of batch 32 does in two.
    run = write_run(tmp_path / "run", {0: healthy(seed=1, per_step=2.0), 1: healthy(seed=2, per_step=2.0)})
    base = write_run(tmp_path / "base", {0: healthy(seed=3)})
    cmp = diagnose([run], baseline=[base]).baseline
    assert cmp.verdict == "agree", cmp.evidence
    assert cmp.aligned_by == "samples"
    assert (cmp.run_global_batch, cmp.baseline_global_batch) == (64, 32)
    assert cmp.compared_steps == [1, 30]  # the baseline's 60 steps are 30 of the run's
    assert cmp.parted_at_step is None and all(r.parted_at_step is None for r in cmp.ranks)


def test_same_global_batch_aligns_by_step(tmp_path: Path) -> None:
    run = write_run(tmp_path / "run", {0: healthy(seed=1), 1: healthy(seed=2)}, batch=16)
    base = write_run(tmp_path / "base", {0: healthy(seed=3)})
    cmp = diagnose([run], baseline=[base]).baseline
    assert cmp.aligned_by == "step" and cmp.verdict == "agree", cmp.evidence


def test_worse_from_a_step_on_is_the_parallel_part(tmp_path: Path) -> None:
    bad = [v * (2.5 if s >= 30 else 1.0) for s, v in enumerate(healthy(seed=1), 1)]
    run = write_run(tmp_path / "run", {0: bad, 1: [v * 1.01 for v in bad]}, batch=16)
    base = write_run(tmp_path / "base", {0: healthy(seed=3)})
    diag = diagnose([run], baseline=[base])
    cmp = diag.baseline
    assert cmp.verdict == "parallel_part", cmp.evidence
    assert cmp.direction == "worse" and 28 <= cmp.parted_at_step <= 32
    assert cmp.run_loss_at_parting > cmp.baseline_loss_at_parting
    # No sync cause was found in these records: the run is no longer called healthy.
    assert diag.verdict != "healthy"
    assert "SD105" not in {f.code for f in diag.findings}


def test_one_rank_offset_is_the_parallel_part(tmp_path: Path) -> None:
    # The mean stays near the baseline's band; one rank's loss sits 2.5× above it.
    run = write_run(tmp_path / "run", {0: healthy(seed=1), 1: [v * 2.5 for v in healthy(seed=2)]}, batch=16)
    base = write_run(tmp_path / "base", {0: healthy(seed=3)})
    cmp = diagnose([run], baseline=[base]).baseline
    assert cmp.verdict == "parallel_part", cmp.evidence
    by_rank = {r.rank: r for r in cmp.ranks}
    assert by_rank[1].direction == "worse" and by_rank[0].parted_at_step is None


def test_both_blow_up_is_not_the_parallel_part_and_ranks_first(tmp_path: Path) -> None:
    run = write_run(tmp_path / "run", {0: blowing_up(seed=1), 1: blowing_up(seed=2)}, batch=16)
    base = write_run(tmp_path / "base", {0: blowing_up(seed=3)})
    diag = diagnose([run], baseline=[base])
    assert diag.baseline.verdict == "not_parallel_part"
    assert diag.baseline.run_problem == diag.baseline.baseline_problem == "blow-up"
    assert diag.findings[0].code == "SD105" and diag.verdict == "not_sync_problem"


def test_both_nonfinite_is_not_the_parallel_part(tmp_path: Path) -> None:
    nan_from_40 = [v if s < 40 else math.nan for s, v in enumerate(healthy(seed=1), 1)]
    run = write_run(tmp_path / "run", {0: nan_from_40, 1: nan_from_40}, batch=16)
    base = write_run(tmp_path / "base", {0: [v if s < 45 else math.inf for s, v in enumerate(healthy(seed=3), 1)]})
    cmp = diagnose([run], baseline=[base]).baseline
    assert cmp.verdict == "not_parallel_part" and cmp.run_problem == "blow-up", cmp.evidence


def test_nonfinite_only_in_the_run_is_the_parallel_part(tmp_path: Path) -> None:
    nan_from_40 = [v if s < 40 else math.nan for s, v in enumerate(healthy(seed=1), 1)]
    run = write_run(tmp_path / "run", {0: nan_from_40, 1: healthy(seed=2)}, batch=16)
    base = write_run(tmp_path / "base", {0: healthy(seed=3)})
    cmp = diagnose([run], baseline=[base]).baseline
    assert cmp.verdict == "parallel_part" and cmp.parted_at_step == 40, cmp.evidence
    assert cmp.run_loss_at_parting is None  # non-finite, said as such


def test_both_stuck_at_one_level_is_not_the_parallel_part(tmp_path: Path) -> None:
    run = write_run(tmp_path / "run", {0: [2.302585] * STEPS, 1: [2.302585] * STEPS}, batch=16)
    base = write_run(tmp_path / "base", {0: [2.302585] * STEPS})
    cmp = diagnose([run], baseline=[base]).baseline
    assert cmp.verdict == "not_parallel_part" and cmp.run_problem == "stuck"


def test_better_than_a_baseline_that_blows_up(tmp_path: Path) -> None:
    run = write_run(tmp_path / "run", {0: healthy(seed=1), 1: healthy(seed=2)}, batch=16)
    base = write_run(tmp_path / "base", {0: blowing_up(seed=3)})
    cmp = diagnose([run], baseline=[base]).baseline
    assert cmp.verdict == "better" and cmp.baseline_problem == "blow-up"


def test_worse_than_a_baseline_with_a_troubled_shape_is_still_the_parallel_part(tmp_path: Path) -> None:
    # The baseline jumps up and back in stages (a shape read as trouble) but ends low; the
    # run's curve is smooth and runs 3x above it from step 30 on: it is the worse one.
    staged = [v * (1.6 if (s // 10) % 2 else 1.0) for s, v in enumerate(healthy(seed=3), 1)]
    worse = [v * (3.0 if s >= 30 else 1.0) for s, v in enumerate(healthy(seed=1), 1)]
    run = write_run(tmp_path / "run", {0: worse, 1: worse}, batch=16)
    base = write_run(tmp_path / "base", {0: staged})
    cmp = diagnose([run], baseline=[base]).baseline
    assert cmp.baseline_problem is not None and cmp.run_problem is None, cmp.evidence
    assert cmp.verdict == "parallel_part" and cmp.direction == "worse", cmp.evidence


def test_lower_loss_is_better(tmp_path: Path) -> None:
    good = [v * (0.4 if s >= 20 else 1.0) for s, v in enumerate(healthy(seed=1), 1)]
    run = write_run(tmp_path / "run", {0: good, 1: good}, batch=16)
    base = write_run(tmp_path / "base", {0: healthy(seed=3)})
    cmp = diagnose([run], baseline=[base]).baseline
    assert cmp.verdict == "better" and cmp.direction == "better" and 18 <= cmp.parted_at_step <= 22


def test_logs_against_logs(tmp_path: Path) -> None:
    base = write_log(tmp_path / "single.log", healthy(seed=3))
    same = write_log(tmp_path / "many.log", healthy(seed=1))
    worse = write_log(tmp_path / "worse.log", [v * (3 if s > 25 else 1) for s, v in enumerate(healthy(seed=1), 1)])
    agree = diagnose([same], baseline=[base]).baseline
    assert agree.verdict == "agree" and agree.aligned_by == "step", agree.evidence
    assert "global batch is unknown" in agree.evidence[0]
    parted = diagnose([worse], baseline=[base]).baseline
    assert parted.verdict == "parallel_part" and 24 <= parted.parted_at_step <= 28


def test_too_little_overlap_is_inconclusive(tmp_path: Path) -> None:
    run = write_log(tmp_path / "run.log", healthy(steps=3, seed=1))
    base = write_log(tmp_path / "base.log", healthy(seed=3))
    assert diagnose([run], baseline=[base]).baseline.verdict == "inconclusive"


def test_no_baseline_leaves_the_diagnosis_as_it_was(tmp_path: Path) -> None:
    run = write_run(tmp_path / "run", {0: healthy(seed=1), 1: healthy(seed=2)})
    diag = diagnose([run])
    assert diag.baseline is None and "baseline" not in diag.to_json()


def test_reports_carry_the_comparison(tmp_path: Path) -> None:
    bad = [v * (2.5 if s >= 30 else 1.0) for s, v in enumerate(healthy(seed=1), 1)]
    run = write_run(tmp_path / "run", {0: bad, 1: bad}, batch=16)
    base = write_run(tmp_path / "base", {0: healthy(seed=3)})
    diag = diagnose([run], baseline=[base])
    data = json.loads(render_json(diag))["baseline"]
    for key in ("verdict", "verdict_text", "aligned_by", "parted_at_step", "noise_band", "run_shape", "ranks"):
        assert key in data
    assert "series" not in data and "series" in json.loads(render_json(diag, include_series=True))["baseline"]
    html = render_html(diag)
    assert 'id="sd-baseline-verdict"' in html and 'id="sd-baseline-parting"' in html
    assert 'id="sd-baseline-run"' in html and 'id="sd-baseline-baseline"' in html


def test_cli_terminal_json_and_bad_baselines(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = write_run(tmp_path / "run", {0: blowing_up(seed=1), 1: blowing_up(seed=2)}, batch=16)
    base = write_run(tmp_path / "base", {0: blowing_up(seed=3)})
    assert main(["diagnose", str(run), "--baseline", str(base), "--json"]) == 1  # SD105 is an error finding
    data = json.loads(capsys.readouterr().out)
    assert data["baseline"]["verdict"] == "not_parallel_part" and data["findings"][0]["code"] == "SD105"
    main(["diagnose", str(run), "--baseline", str(base)])
    assert "Against the baseline" in capsys.readouterr().out

    empty = tmp_path / "empty"
    empty.mkdir()
    unreadable = write_log(tmp_path / "noloss.log", [])
    for bad in (tmp_path / "missing", empty, unreadable):
        assert main(["diagnose", str(run), "--baseline", str(bad)]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("syncdoctor: error: --baseline:") and "\n" not in err, err
    with pytest.raises(InputError, match="--baseline"):
        diagnose([run], baseline=[tmp_path / "missing"])


@pytest.mark.parametrize("seed", [11, 12, 13])
def test_a_steady_gap_inside_the_band_parts_and_noise_does_not(tmp_path: Path, seed: int) -> None:
    # 200 steps of 5 % noise: the band is about ×1.08, two standard errors about ×1.04.
    # A run 7 % above the baseline throughout crosses the band on some points only.
    base = write_log(tmp_path / "base.log", healthy(200, seed=seed))
    worse = write_log(tmp_path / "worse.log", list(np.asarray(healthy(200, seed=seed + 100)) * 1.07))
    same = write_log(tmp_path / "same.log", healthy(200, seed=seed + 100))
    cmp = diagnose([worse], baseline=[base]).baseline
    assert cmp.verdict == "parallel_part" and cmp.direction == "worse", cmp.evidence
    assert cmp.parted_at_step is not None
    assert diagnose([same], baseline=[base]).baseline.verdict == "agree"
