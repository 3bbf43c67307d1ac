"""`syncdoctor run` says plainly when no rank attached, and why it might be."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from syncdoctor.probe.run.launcher import attach_report

SYNCDOCTOR = [sys.executable, "-c", "import sys; from syncdoctor.cli import main; sys.exit(main())"]


def test_report_names_the_records_or_what_the_markers_say(tmp_path: Path) -> None:
    assert "no process of the command imported torch" in attach_report(tmp_path)
    procs = tmp_path / ".syncdoctor" / "procs"
    procs.mkdir(parents=True)
    (procs / "torch.123").write_text("train.py\n")
    line = attach_report(tmp_path)
    assert line.startswith("no rank attached") and "1 process(es) imported torch" in line
    assert "accelerate launch --cpu" in line and "next: syncdoctor diagnose" not in line
    (tmp_path / "records").mkdir()
    (tmp_path / "records" / "rank0.jsonl").write_text("")
    assert "one rank attached" in attach_report(tmp_path)
    (tmp_path / "records" / "rank1.jsonl").write_text("")
    assert attach_report(tmp_path) == f"records and logs in {tmp_path}; next: syncdoctor diagnose {tmp_path}"


def test_a_process_that_imports_torch_but_never_trains(tmp_path: Path) -> None:
    """One process, no process group, no launcher rank: nothing attaches, and the
    run says so instead of suggesting a diagnose that would fail."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        env.pop(name, None)
    proc = subprocess.run(
        [
            *SYNCDOCTOR,
            "run",
            "--out",
            str(tmp_path / "run"),
            "--",
            sys.executable,
            "-c",
            "import torch; print('trained', flush=True)",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0 and proc.stdout.strip() == "trained"
    assert "no rank attached" in proc.stderr and "1 process(es) imported torch" in proc.stderr
    assert "next: syncdoctor diagnose" not in proc.stderr
