"""The doctor on real lab runs: each fault's root cause comes out on top, clean runs
stay healthy, and logs alone still give the right verdict for faults that show in
the loss. The tests that ask for `lab` are slow (tests/conftest.py marks them)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from syncdoctor.cli import main
from syncdoctor.doctor.diagnose import diagnose
from syncdoctor.lab.matrix import cases

FAULT_CASES = [(f, v) for f, v, _ in cases() if f != "clean"]
# The detection matrix at world size 2 (every fault, three clean seeds) and a clean run at
# 4: started ahead, two at a time (tests/conftest.py).
LAB_RUNS = [{"fault": f, "variant": v, "seed": s} for f, v, s in cases()] + [{"fault": "clean", "world_size": 4}]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_clean_baseline_is_healthy(lab, seed: int) -> None:
    diag = diagnose([lab("clean", seed=seed).out])
    assert diag.verdict == "healthy", [(f.code, f.evidence) for f in diag.findings]
    assert not [f for f in diag.findings if f.severity == "error"]
    assert diag.exit_code == 0


def test_clean_world_size_4_is_healthy(lab) -> None:
    assert diagnose([lab("clean", world_size=4).out]).verdict == "healthy"


@pytest.mark.parametrize(("fault", "variant"), FAULT_CASES)
def test_fault_is_detected_with_the_right_top_category(lab, fault: str, variant: str) -> None:
    from syncdoctor.lab.faults import FAULTS

    diag = diagnose([lab(fault, variant).out])
    assert diag.findings, f"{fault}: nothing found"
    top = diag.findings[0]
    assert top.category == FAULTS[fault].category, [(f.code, f.category, f.confidence) for f in diag.findings]
    assert top.evidence and top.fix
    expected = (
        "not_sync_problem" if FAULTS[fault].category in ("train.divergence", "hparam.lr_scaling") else "sync_problem"
    )
    assert diag.verdict == expected


def test_divergence_step_ranks_and_tensor_are_named(lab) -> None:
    diag = diagnose([lab("dropped-rank").out])
    top = diag.findings[0]
    assert top.ranks == [1]
    assert 40 <= top.step <= 50
    assert top.tensor == "conv1.weight"
    assert diag.divergence_step == top.step


def test_crash_blames_the_rank_that_died_not_the_network(lab) -> None:
    diag = diagnose([lab("rank-crash").out])
    assert diag.findings[0].category == "process.crash"
    assert diag.findings[0].ranks == [1]


def _logs_only(run_out: Path, dest: Path) -> Path:
    """The run's training logs as a user without the probe has them: the probe changes
    nothing in training (tests/e2e/zoo shows it bitwise), so dropping the lines it printed
    leaves the plain logs, and the probe run is shared instead of run again."""
    dest.mkdir(parents=True)
    for log in run_out.glob("train.log*"):
        lines = log.read_text(errors="replace").splitlines(keepends=True)
        plain = [line for line in lines if not line.startswith("syncdoctor:")]  # every probe line
        assert plain, log
        (dest / log.name).write_text("".join(plain))
    return dest


@pytest.mark.parametrize(
    ("fault", "verdict", "category"),
    [
        ("loss-hparam-mismatch", "sync_problem", "loss.definition_mismatch"),
        ("duplicate-rank-id", "sync_problem", "config.rank_identity"),
        ("rank-crash", "sync_problem", "process.crash"),
        ("comm-timeout", "sync_problem", "comm.fault"),
        ("lr-too-high", "not_sync_problem", "train.divergence"),
    ],
)
def test_logs_alone_give_the_right_verdict(lab, tmp_path: Path, fault: str, verdict: str, category: str) -> None:
    diag = diagnose([_logs_only(lab(fault).out, tmp_path / fault)])
    assert diag.verdict == verdict, [(f.code, f.category) for f in diag.findings]
    assert diag.findings[0].category == category
    assert diag.loss_shape is not None


def test_logs_alone_of_a_clean_run_are_healthy(lab, tmp_path: Path) -> None:
    diag = diagnose([_logs_only(lab("clean").out, tmp_path / "clean")])
    assert diag.verdict == "healthy"
    assert diag.loss_shape.shape == "decreasing"


PLAYBOOK = [0.25, 0.34, 0.49, 0.28, 0.52, 0.81, 0.96, 0.67, 1.12, 1.56]


def test_playbook_sequence_and_lines(tmp_path: Path) -> None:
    log = tmp_path / "train.log0"
    lines = [f"step {i}: loss {v}" for i, v in enumerate(PLAYBOOK, 1)]
    lines += [
        "[ERROR] GRADIENT_SYNC: Rank 0 and Rank 1 parameter gradient mismatch at step 1200",
        "[WARNING] Loss shows abnormal fluctuation: from 0.25 to 1.56 within 10 steps",
    ]
    log.write_text("\n".join(lines) + "\n")
    diag = diagnose([log])
    assert diag.loss_shape.shape == "sawtooth"
    assert any("GRADIENT_SYNC" in e.raw for e in diag.events)
    assert any("abnormal fluctuation" in e.raw for e in diag.events)
    top = diag.findings[0]
    assert top.code == "SD405" and top.ranks == [0, 1] and top.step == 1200
    assert diag.verdict == "sync_problem"


def test_cli_json_schema_html_and_exit_codes(lab, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    html = tmp_path / "report.html"
    code = main(["diagnose", str(lab("dropped-rank").out), "--json", "--html", str(html)])
    data = json.loads(capsys.readouterr().out)
    assert code == 1
    assert data["schema"] == "syncdoctor.diagnosis/1"
    assert data["verdict"] == "sync_problem"
    assert {"code", "category", "severity", "confidence", "title", "ranks", "step", "tensor", "evidence", "fix"} <= set(
        data["findings"][0]
    )
    page = html.read_text()
    # Self-contained and light: charts drawn as inline SVG, no script at all.
    assert "<svg" in page and "<script" not in page and html.stat().st_size < 1_000_000
    assert main(["diagnose", str(lab("clean").out), "--json"]) == 0
    capsys.readouterr()


@pytest.mark.parametrize("make", ["empty_dir", "missing"])
def test_nothing_to_read_is_a_one_line_usage_error(tmp_path: Path, capsys, make: str) -> None:
    target = tmp_path / "x"
    if make == "empty_dir":
        target.mkdir()
    assert main(["diagnose", str(target)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("syncdoctor: error:")


def test_damaged_run_folder_gives_a_partial_report(lab, tmp_path: Path) -> None:
    run = tmp_path / "damaged"
    shutil.copytree(lab("skipped-step").out, run)
    records = run / "records" / "rank1.jsonl"
    data = records.read_bytes()
    records.write_bytes(data[: len(data) // 2])  # killed mid-write
    (run / "train.log1").write_bytes(b"\xff\xfe\x00junk" * 1000 + b"x" * 10_000_000 + b"\n")
    (run / "records" / "rank7.jsonl").write_bytes(b"\x00\x01 binary")
    diag = diagnose([run])
    assert diag.findings and diag.findings[0].category == "sync.step_misalignment"
    assert any("truncated" in w for w in diag.warnings)


def test_unknown_record_version_is_refused(tmp_path: Path, capsys) -> None:
    (tmp_path / "records").mkdir()
    (tmp_path / "records" / "rank0.jsonl").write_text('{"v":99,"kind":"snapshot","rank":0}\n')
    assert main(["diagnose", str(tmp_path)]) == 2
    assert "schema version" in capsys.readouterr().err
