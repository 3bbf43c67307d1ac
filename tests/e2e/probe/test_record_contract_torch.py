"""The record contract (tests/unit/test_record_contract.py) on a real run: a torch
probe over 2 gloo ranks (tests/e2e/probe/scripts/contract_job.py) writes only
contract fields, with their types, and every field the contract says it writes; the
doctor, reading that run, reads only contract fields."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from syncdoctor import settings
from syncdoctor.records import contract
from tests.unit.test_record_contract import JOB, TORCH_NOT_IN_SHORT_RUN, check_probe_runs


@pytest.fixture(scope="module")
def torch_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from syncdoctor.lab.launch import free_port

    run_dir = tmp_path_factory.mktemp("contract") / "run"
    env = {
        **os.environ,
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
        "WORLD_SIZE": "2",
        settings.VALIDATE_RECORDS_ENV: "1",
        "OMP_NUM_THREADS": "1",
    }
    procs = [
        subprocess.Popen(
            [sys.executable, str(JOB), str(run_dir)],
            env={**env, "RANK": str(rank)},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        for rank in range(2)
    ]
    try:
        outputs = [p.communicate(timeout=300)[0].decode(errors="replace") for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert all(p.returncode == 0 for p in procs), "\n".join(o[-2000:] for o in outputs)
    return run_dir


def test_torch_probe_writes_the_contract(torch_run: Path) -> None:
    check_probe_runs([torch_run], contract.TORCH, TORCH_NOT_IN_SHORT_RUN)


class _Reads(dict):
    """A record that notes every key read from it (and from its sections)."""

    def __init__(self, value: dict[str, Any], where: str, seen: set[tuple[str, str]]) -> None:
        super().__init__(value)
        self.where, self.seen = where, seen

    def _note(self, key: Any) -> None:
        self.seen.add((self.where, key))

    def __getitem__(self, key: Any) -> Any:
        self._note(key)
        return self._wrap(key, super().__getitem__(key))

    def get(self, key: Any, default: Any = None) -> Any:
        self._note(key)
        return self._wrap(key, super().get(key, default))

    def __contains__(self, key: Any) -> bool:
        self._note(key)
        return super().__contains__(key)

    def _wrap(self, key: Any, value: Any) -> Any:
        spec = next((f for f in contract.KINDS.get(self.where, ()) if f.name == key), None)
        if spec is not None and spec.type == "section" and isinstance(value, dict):
            return _Reads(value, f"{self.where}.{key}", self.seen)
        return value


def doctor_reads(run_dir: Path) -> tuple[set[tuple[str, str]], list[str]]:
    """(where, key) the doctor reads from the run's non-step records, and its warnings."""
    from syncdoctor.doctor.diagnose import diagnose_evidence
    from syncdoctor.doctor.evidence import Evidence
    from syncdoctor.records import read_run

    records = read_run(run_dir)
    seen: set[tuple[str, str]] = set()
    records.snapshots = {r: _Reads(s, "snapshot", seen) for r, s in records.snapshots.items()}
    records.checks = [_Reads(c, "check", seen) for c in records.checks]
    records.events = [_Reads(e, "event", seen) for e in records.events]
    records.ends = {r: _Reads(e, "end", seen) for r, e in records.ends.items()}
    diagnosis = diagnose_evidence(Evidence(records=records))
    return seen, diagnosis.warnings


def contract_keys() -> set[tuple[str, str]]:
    out = set()
    for kind, fields in contract.KINDS.items():
        for f in fields:
            out.add((kind, f.name))
            out.update((f"{kind}.{f.name}", sub.name) for sub in f.fields)
    return out


def test_doctor_reads_only_contract_fields(torch_run: Path) -> None:
    seen, warnings = doctor_reads(torch_run)
    assert seen, "the doctor read nothing: the tracking lost the records"
    unknown = sorted(seen - contract_keys())
    assert not unknown, f"the doctor reads fields no contract defines (so no probe writes them): {unknown}"
    # A step column the doctor reads that the reader's schema (the contract) lacks fails the rule.
    failed = [w for w in warnings if "failed on this input" in w]
    assert not failed, failed
