"""The record contract (records/contract.py) holds the probes, the reader and the
docs to one definition: a field renamed on one side only fails here.

- the reader's step schema and type checks are the contract's fields;
- docs/records.md lists every contract field;
- a real torch probe run (2 gloo ranks, tests/e2e/probe/scripts/contract_job.py) writes
  only contract fields, with their types, and every field the contract says it writes
  (the MindSpore probe: tests/mindspore/test_zero_code.py), and the doctor, reading that
  run, reads only contract fields: both in tests/e2e/probe/test_record_contract_torch.py;
- and the other way: every field a probe writes is read by the doctor (its source
  names it), unless the contract's reader lists say who else reads it.
"""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path
from typing import Any

import pytest

from syncdoctor import settings
from syncdoctor.records import contract
from syncdoctor.records.reader import _FIELD_TYPES
from syncdoctor.records.schema import STEP_SCHEMA
from syncdoctor.records.tail import NO_LR, format_step
from syncdoctor.records.writer import RecordWriter

ROOT = Path(__file__).resolve().parents[2]
JOB = ROOT / "tests" / "e2e" / "probe" / "scripts" / "contract_job.py"

# Fields the torch probe writes only where the short job cannot go, and why.
TORCH_NOT_IN_SHORT_RUN = {
    (
        "snapshot",
        "replica",
    ): "sharded/hybrid jobs only (tests/e2e/lab/test_mesh_lab.py, tests/unit/probe/test_mesh_units.py)",
    ("snapshot", "init_param_fp_local"): "zero-code mode only (tests/e2e/probe/test_run_cli.py)",
    ("snapshot", "segment"): "a model rebuilt in the process only (tests/e2e/probe/test_round_trip.py)",
    ("snapshot", "init_params_changed"): "weights loaded after the DDP wrap only (tests/e2e/probe/test_round_trip.py)",
    ("step", "uncovered_grads"): "a parameter trained outside DDP's reducer only (tests/e2e/probe/test_round_trip.py)",
    ("step", "uncovered_first"): "a parameter trained outside DDP's reducer only (tests/e2e/probe/test_round_trip.py)",
    **{
        ("step", name): "parameters rebound on one rank only (tests/e2e/probe/test_round_trip.py)"
        for name in ("params_rebound", "params_rebound_first")
    },
    **{
        ("step", name): "an update that read a parameter without a gradient only (tests/e2e/probe/test_round_trip.py)"
        for name in ("grads_missing_first", "grads_missing_fp")
    },
    ("step", "replica_fps"): "sharded/hybrid jobs only",
    **{
        ("step", name): "gradient accumulation under no_sync only (tests/e2e/probe/test_round_trip.py)"
        for name in ("syncs", "discarded")
    },
    **{
        ("step", name): "an update none of whose backward calls synchronised only (tests/e2e/probe/test_round_trip.py)"
        for name in ("unsynced_updates", "unsynced_first", "unsynced_how")
    },
    ("end", "pending_syncs"): "a rank that ends between backward and update only (tests/e2e/probe/test_round_trip.py)",
    **{
        ("event", name): "events come from probe failures and heals (tests/e2e/probe/test_heal.py)"
        for name in contract.names("event")
    },
}


def written_fields(records: list[dict[str, Any]]) -> set[tuple[str, str]]:
    """(kind, field) and (kind.section, field) for every key the records hold."""
    out: set[tuple[str, str]] = set()
    for rec in records:
        kind = rec["kind"]
        for key, value in rec.items():
            out.add((kind, key))
            spec = next((f for f in contract.KINDS.get(kind, ()) if f.name == key), None)
            if spec is not None and spec.type in ("section", "struct") and isinstance(value, dict):
                out.update((f"{kind}.{key}", sub) for sub in value)
    return out


def promised_fields(probe: str) -> set[tuple[str, str]]:
    """What the contract says `probe` writes (sections included)."""
    out: set[tuple[str, str]] = set()
    for kind, fields in contract.KINDS.items():
        for f in fields:
            if probe in f.by:
                out.add((kind, f.name))
                if f.type in ("section",):
                    out.update((f"{kind}.{f.name}", sub.name) for sub in f.fields if probe in sub.by)
    return out


def read_records(run_dir: Path) -> list[dict[str, Any]]:
    return [
        json.loads(line)
        for path in sorted((run_dir / "records").glob("rank*.jsonl"))
        for line in path.read_text().splitlines()
        if line.strip()
    ]


def check_probe_runs(run_dirs: list[Path], probe: str, not_in_run: dict[tuple[str, str], str]) -> None:
    """The assertions of a probe's contract test, on its run folders: every record in
    the contract, and every field the contract says `probe` writes in some record."""
    violations = sorted(p for run_dir in run_dirs for p in (run_dir / "records").glob("*.violations"))
    assert not violations, "the validating writer found fields outside the contract:\n" + "".join(
        p.read_text() for p in violations
    )
    records = [rec for run_dir in run_dirs for rec in read_records(run_dir)]
    broken = [v for rec in records for v in contract.violations(rec)]
    assert not broken, f"records outside the contract: {sorted(set(broken))}"
    for rec in records:
        if rec["kind"] == "step" and rec.get("train_mode") is not None:
            assert contract.TRAIN_MODE.match(rec["train_mode"]), rec["train_mode"]
    missing = promised_fields(probe) - written_fields(records) - set(not_in_run)
    assert not missing, f"the contract says the {probe} probe writes these, the run has none: {sorted(missing)}"


# -- fast: the reader and the docs ------------------------------------------------------------------
def test_reader_step_schema_is_the_contract() -> None:
    assert list(STEP_SCHEMA) == list(contract.names("step"))


def test_reader_type_checks_are_the_contract() -> None:
    for kind in ("snapshot", "check", "event", "end"):
        assert set(_FIELD_TYPES[kind]) == set(contract.names(kind)) - {"v", "kind", "rank"}


def test_every_field_has_a_writer_and_a_meaning() -> None:
    for kind, fields in contract.KINDS.items():
        for f in fields:
            assert f.by and f.meaning, (kind, f.name)
            for sub in f.fields:
                assert sub.by and sub.meaning, (kind, f.name, sub.name)


def _doc_sections() -> dict[str, str]:
    text = (ROOT / "docs" / "records.md").read_text()
    parts = re.split(r'^## kind = "(\w+)".*$', text, flags=re.M)
    return {parts[i]: parts[i + 1].split("\n## ")[0] for i in range(1, len(parts), 2)}


def test_docs_list_every_contract_field() -> None:
    sections = _doc_sections()
    for kind, fields in contract.KINDS.items():
        listed = set(re.findall(r"`?\b([a-z_0-9]+)\b`?", sections[kind]))
        missing = [f.name for f in fields if f.name not in listed and f.name not in ("v", "kind")]
        missing += [
            f"{f.name}.{sub.name}" for f in fields if f.type == "section" for sub in f.fields if sub.name not in listed
        ]
        assert not missing, f'docs/records.md, kind = "{kind}", does not list: {missing}'


# -- the other way: every field written is read -------------------------------------------------------
# The doctor's side: the analyses, rules and reports, and the reader (which reads `v` and `kind`).
DOCTOR_SOURCES = (ROOT / "src" / "syncdoctor" / "doctor", ROOT / "src" / "syncdoctor" / "records" / "reader.py")

# Fields a probe writes that the doctor does not read, and who does instead.
READ_ELSEWHERE = {
    ("step", "acts"): "read by the canary rule (h/canary)",
    ("event", "variant"): "read by the experiment orchestrator (h/variants, h/experiment)",
}


def doctor_string_keys() -> dict[str, set[str]]:
    """Every string literal in the doctor's source (docstrings and f-string text left
    out), with the files that hold it.

    Why a scan of the source and not a record that notes each key read at run time:
    step fields are polars columns, read inside expressions no wrapper can watch, and
    a rule reads some fields only when its fault is there (a clean run would call them
    unread). A field is read when the doctor names it: `snap.get("pid")`,
    `pl.col("config_fp")`, `ev.differing("optimizer", "n_params")`, a tuple of names.
    What a scan cannot tell apart is two fields with one name (`type` of the loader and
    of the optimizer): those count as read if either is."""
    sources = [p for root in DOCTOR_SOURCES for p in ([root] if root.is_file() else sorted(root.rglob("*.py")))]
    found: dict[str, set[str]] = {}
    for path in sources:
        tree = ast.parse(path.read_text(), str(path))
        prose = set()
        for node in ast.walk(tree):
            body = getattr(node, "body", None)
            if isinstance(body, list) and body and isinstance(body[0], ast.Expr):
                prose.add(id(body[0].value))  # a docstring
            if isinstance(node, ast.JoinedStr):
                prose.update(id(part) for part in node.values)
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in prose:
                found.setdefault(node.value, set()).add(path.relative_to(ROOT).as_posix())
    return found


def written_contract_fields() -> list[tuple[str, str, contract.Field]]:
    """(where, name, field) of every field and section key in the contract."""
    out = []
    for kind, fields in contract.KINDS.items():
        for f in fields:
            out.append((kind, f.name, f))
            out += [(f"{kind}.{f.name}", sub.name, sub) for sub in f.fields]
    return out


def _field_of(where: str, name: str) -> tuple[str, str]:
    """(kind, top-level field) of a field or a section's key."""
    kind, _, section = where.partition(".")
    return kind, section or name


def test_doctor_reads_every_field_a_probe_writes() -> None:
    keys = doctor_string_keys()
    assert "param_fp" in keys, "the scan found none of the doctor's reads: its sources moved?"
    unread = [
        f"{where}.{name} (written by the {' and '.join(f.by)} probe)"
        for where, name, f in written_contract_fields()
        if name not in keys and _field_of(where, name) not in READ_ELSEWHERE
    ]
    assert not unread, (
        "a probe writes these fields and nothing in the doctor reads them (read them in a rule or in the "
        "report's run facts, or stop writing them and drop them from records/contract.py): " + ", ".join(unread)
    )


def test_read_elsewhere_names_contract_fields() -> None:
    stale = [key for key in READ_ELSEWHERE if key[1] not in contract.names(key[0])]
    assert not stale, f"READ_ELSEWHERE lists fields the contract no longer has: {stale}"


def test_train_mode_has_one_encoding() -> None:
    assert contract.train_mode([True, True, True]) == "3/3"
    assert contract.train_mode([False, False]) == "0/2"
    assert contract.train_mode([True, False, True]) == "2/3:5"
    for value in ("3/3", "0/2", "2/3:5"):
        assert contract.TRAIN_MODE.match(value)


def test_validating_writer_names_a_field_outside_the_contract(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(settings.VALIDATE_RECORDS_ENV, "1")
    writer = RecordWriter(tmp_path, 0)
    writer.write(
        "step",
        rank=0,
        step=1,
        micro=1,
        backward=1,
        opt_steps=1,
        t=1.0,
        loss=float("nan"),
        lr=0.1,
        grad_norm_locl=2.0,
        overflow=1,
    )
    writer.close()
    found = (tmp_path / "records" / "rank0.violations").read_text().splitlines()
    assert found == ["step.grad_norm_locl: not in the contract", "step.overflow: int is not bool"]
    assert json.loads((tmp_path / "records" / "rank0.jsonl").read_text())["nonfinite"] == {"loss": "nan"}


def test_every_step_fast_path_keeps_the_contract() -> None:
    for absent, loss in ((0, 1.5), (NO_LR, float("inf"))):
        record = json.loads(format_step(3, 7, 1, 7, 7, 1.0, loss, 0.0, absent))
        assert contract.violations(record) == []


# The real torch probe run and the doctor reading it: tests/e2e/probe/test_record_contract_torch.py.
