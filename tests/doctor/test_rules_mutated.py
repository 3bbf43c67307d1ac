"""Rules whose faults the lab does not inject, each on a clean lab run with one thing
changed the way a real job would have it: the rule must fire, naming its cause,
while the untouched run stays healthy (tests/doctor/test_diagnose.py)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from syncdoctor.doctor.diagnose import diagnose

pytestmark = pytest.mark.slow


def _edit_records(run: Path, rank: int, edit: Callable[[dict], None]) -> None:
    path = run / "records" / f"rank{rank}.jsonl"
    lines = []
    for line in path.read_text().splitlines():
        record = json.loads(line)
        edit(record)
        lines.append(json.dumps(record, separators=(",", ":")))
    path.write_text("\n".join(lines) + "\n")


def _snapshot(edit: Callable[[dict], None]) -> Callable[[dict], None]:
    return lambda record: edit(record) if record["kind"] == "snapshot" else None


def _copy_rank_env(record: dict) -> None:
    record["env"].update({"RANK": "0", "LOCAL_RANK": "0"})


def _same_device(record: dict) -> None:
    record["env"]["DEVICE_ID"] = "0"


def _other_code(record: dict) -> None:
    record["code"]["entry_sha256"] = "0" * 64


def _huge_local_grads(record: dict) -> None:
    if record["kind"] == "step" and record.get("grad_norm_local"):
        record["grad_norm_local"] *= 100


CASES = {
    "SD201": (1, _snapshot(_copy_rank_env), "config.rank_identity"),
    "SD202": (1, _snapshot(_same_device), "env.device"),
    "SD801": (1, _snapshot(_other_code), "code.version_mismatch"),
    "SD702": (1, _huge_local_grads, "loss.definition_mismatch"),
}


@pytest.mark.parametrize("code", sorted(CASES))
def test_rule_fires_on_a_mutated_clean_run(lab, tmp_path: Path, code: str) -> None:
    run = tmp_path / "run"
    shutil.copytree(lab("clean").out, run)
    rank, edit, category = CASES[code]
    if code == "SD202":
        _edit_records(run, 0, _snapshot(_same_device))
    _edit_records(run, rank, edit)
    diag = diagnose([run])
    found = {f.code: f for f in diag.findings}
    assert code in found, [(f.code, f.evidence) for f in diag.findings]
    assert found[code].category == category
    assert rank in found[code].ranks
    assert diag.verdict == "sync_problem"


def test_collective_mismatch_from_a_log_line(lab, tmp_path: Path) -> None:
    run = tmp_path / "run"
    shutil.copytree(lab("clean").out, run)
    with (run / "train.log1").open("a") as log:
        log.write("[rank1]: RuntimeError: Detected mismatch between collectives on ranks. Rank 1 is running "
                  "collective: CollectiveFingerPrint(SequenceNumber=12, OpType=ALLREDUCE), but Rank 0 is "
                  "running collective: CollectiveFingerPrint(SequenceNumber=12, OpType=BROADCAST).\n")
    diag = diagnose([run])
    assert diag.findings[0].code == "SD404"
    assert diag.findings[0].category == "sync.control_flow"
