"""The four fuzz targets, shared by the atheris harnesses (fuzz/fuzz_*.py) and the
hypothesis property tests (tests/unit/reliability/test_fuzz_properties.py), so both feed
the same code the same way and hold it to the same contract:

    only the documented input errors may escape (``syncdoctor.errors.InputError``,
    ``syncdoctor.records.RecordError``, ``RankTableError`` from the rank-table
    reader); everything else a hostile input causes must come back as a one-line
    warning or finding, never as an exception.

Each target writes its input into a fresh temporary folder, exactly as a user's
files would sit on disk, and calls the public entry point on it.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import tempfile
from collections.abc import Mapping
from pathlib import Path

from rich.console import Console

from syncdoctor.cli import main as cli_main
from syncdoctor.doctor.diagnose import diagnose
from syncdoctor.doctor.ingest import LogData, ingest_logs
from syncdoctor.doctor.model import Diagnosis
from syncdoctor.doctor.report import render_json, render_terminal
from syncdoctor.doctor.rules import all_rules
from syncdoctor.errors import InputError
from syncdoctor.preflight.engine import run_preflight
from syncdoctor.preflight.rank_table import RankTable, RankTableError, load_rank_table
from syncdoctor.preflight.registry import all_checks
from syncdoctor.records.reader import RunRecords, read_run
from syncdoctor.records.schema import RecordError

# What may escape each entry point: the errors the API documents for bad input.
DIAGNOSE_ERRORS = (InputError, RecordError)
# Terminal output may keep newlines and our own SGR styling, nothing else.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")

Files = Mapping[str, bytes]

# Import every rule and check now: they load lazily on first use, and the atheris
# harnesses must import them inside their instrumentation block to get coverage.
all_rules()
all_checks()


def _write(root: Path, files: Files) -> None:
    for name, data in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)


def _printable(text: str, newlines: bool) -> None:
    """What reaches a terminal holds no control character (newlines where allowed)."""
    bad = _CONTROL.search(text.replace("\n", "") if newlines else text)
    assert bad is None, f"control character {bad.group()!r} in output: {text[:200]!r}"


def _one_line(warnings: list[str]) -> None:
    for w in warnings:
        assert isinstance(w, str) and "\n" not in w, f"warning is not one line: {w!r}"


def check_logs(files: Files) -> LogData | None:
    """ingest_logs on a folder of log files: InputError only when nothing could be read."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        _write(root, files)
        try:
            data = ingest_logs([root])
        except InputError:
            return None
        _one_line(data.warnings)
        assert set(data.losses.columns) >= {"rank", "step", "loss"}
        return data


def check_records(files: Files) -> RunRecords | None:
    """read_run on a run folder whose records/ holds ``files``: RecordError only."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        _write(root / "records", files)
        try:
            run = read_run(root)
        except RecordError as exc:
            assert "\n" not in str(exc)
            return None
        _one_line(run.warnings)
        return run


def check_rank_table(text: bytes) -> RankTable | None:
    """The rank-table reader, then every rank-table check through run_preflight."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "hccl.json"
        path.write_bytes(text)
        try:
            table = load_rank_table(path)
        except RankTableError:
            table = None
        # A table that cannot be read becomes a PF100 finding, never an exception.
        findings = run_preflight([], path, environ={"RANK_SIZE": "8"}, select=["PF1"])
        for f in findings:
            _printable(f.render(), newlines=False)
        return table


def check_diagnose(records: Files, logs: Files, html: bool = False) -> Diagnosis | None:
    """The whole pipeline: diagnose() on a run folder (records/ + logs beside them),
    then the JSON and terminal reports (and the HTML one when asked: it embeds
    plotly, megabytes per call, too slow for every fuzz input)."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        _write(root / "records", records)
        _write(root, logs)
        try:
            diag = diagnose([root])
        except DIAGNOSE_ERRORS as exc:
            assert "\n" not in str(exc)
            return None
        _one_line(diag.warnings)
        json.loads(render_json(diag))  # strict JSON, whatever numbers came in
        out = io.StringIO()
        render_terminal(diag, Console(file=out, width=100, force_terminal=False, color_system=None))
        _printable(out.getvalue(), newlines=True)
        if html:
            from syncdoctor.doctor.report import render_html

            render_html(diag)
        return diag


def check_cli(records: Files, logs: Files) -> int:
    """``syncdoctor diagnose DIR --json`` returns an exit code, never raises."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        _write(root / "records", records)
        _write(root, logs)
        # The CLI prints the whole report; a fuzz run would fill the log with it.
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            code = cli_main(["diagnose", str(root), "--json"])
        assert code in (0, 1, 2), code
        return code
