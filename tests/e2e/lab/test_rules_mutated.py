"""A rule whose fault the lab does not inject, on a clean lab run with one thing
changed the way a real job would have it (end to end; the fast cases of every rule,
mutated clean runs among them, are under tests/rules/)."""

from __future__ import annotations

import shutil
from pathlib import Path

from syncdoctor.doctor.diagnose import diagnose

LAB_RUNS = [{"fault": "clean"}]  # started ahead (tests/conftest.py)


def test_collective_mismatch_from_a_log_line(lab, tmp_path: Path) -> None:
    run = tmp_path / "run"
    shutil.copytree(lab("clean").out, run)
    with (run / "train.log1").open("a") as log:
        log.write(
            "[rank1]: RuntimeError: Detected mismatch between collectives on ranks. Rank 1 is running "
            "collective: CollectiveFingerPrint(SequenceNumber=12, OpType=ALLREDUCE), but Rank 0 is "
            "running collective: CollectiveFingerPrint(SequenceNumber=12, OpType=BROADCAST).\n"
        )
    diag = diagnose([run])
    assert diag.findings[0].code == "SD404"
    assert diag.findings[0].category == "sync.control_flow"
