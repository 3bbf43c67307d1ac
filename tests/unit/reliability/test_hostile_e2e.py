"""Hostile log and record content end to end: `syncdoctor diagnose DIR --html F`
through the CLI, the terminal output checked for control sequences, the HTML
opened in headless Chromium and checked for any trace of a payload having run.
(The renderers' own escaping tests, on a synthetic Diagnosis, are in
tests/unit/doctor/test_report*.py; this one feeds the payloads in through the parsers.)"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from syncdoctor.cli import main

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "fixtures" / "report"))
sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "fuzz"))
from browser import CHROMIUM, SKIP_REASON, dump_dom, hostile_traces  # noqa: E402
from corpus import synthetic_records  # noqa: E402
from hostile import ALL_HOSTILE, CLOSE_SCRIPT, IMG_ONERROR, SCRIPT_TAG  # noqa: E402

ABSURD = ("1e308", "nan", "-0.0", "inf", "-1e308", "1e309", "4.9e-324", "9" * 30)
# What may reach a terminal: printable text and newlines (the CLI under test is not
# a TTY, so not even our own colour codes).
_CONTROL = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def _hostile_run(root: Path) -> None:
    for rank in range(2):
        lines = [f"step {s} loss {2.0 / s:.4f}" for s in range(1, 41)]
        lines += [f"step {40 + i} loss {x} {SCRIPT_TAG}" for i, x in enumerate(ABSURD, 1)]
        lines += [
            f"[ERROR] HCCL hcom_allreduce retry 1 timeout {ALL_HOSTILE}",
            f"RuntimeError: NCCL communicator was aborted {IMG_ONERROR}",
            f"[rank{rank}] Watchdog caught collective operation timeout {CLOSE_SCRIPT}",
            "\x1b]0;owned-terminal-title\x07\x1b[2J step 60 loss 0.5",
        ]
        (root / f"train.log{rank}").write_text("\n".join(lines) + "\n", encoding="utf-8")
    (root / "records").mkdir()
    for rank, blob in enumerate(synthetic_records(world=2)):
        event = {
            "v": 1,
            "kind": "event",
            "rank": rank,
            "t": 1.0e9,
            "step": 3,
            "event": "timeout" + SCRIPT_TAG,
            "message": ALL_HOSTILE,
        }
        check = {
            "v": 1,
            "kind": "check",
            "rank": rank,
            "step": 5,
            "status": "mismatch",
            "what": ["param", IMG_ONERROR],
            "ranks": [1],
            "tensor": "w" + CLOSE_SCRIPT,
            "detail": {},
        }
        extra = (json.dumps(event) + "\n" + json.dumps(check) + "\n").encode()
        (root / "records" / f"rank{rank}.jsonl").write_bytes(blob + extra)


@pytest.fixture(scope="module")
def hostile_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("hostile")
    _hostile_run(root)
    return root, root.parent / f"{root.name}-report.html"


def test_terminal_output_has_no_control_sequences(hostile_run, capsys):
    root, html = hostile_run
    code = main(["diagnose", str(root), "--html", str(html)])
    out, err = capsys.readouterr()
    assert code in (0, 1), err
    assert not _CONTROL.search(out + err), repr(_CONTROL.search(out + err))
    assert "owned-terminal-title" not in out
    assert "window.__pwned" in out  # the payloads did reach the report, as inert text
    assert html.is_file()


def test_json_output_is_strict_and_keeps_payloads_as_strings(hostile_run, capsys):
    root, _ = hostile_run
    assert main(["diagnose", str(root), "--json"]) in (0, 1)
    data = json.loads(capsys.readouterr().out, parse_constant=lambda c: pytest.fail(c))
    assert "<script>" in json.dumps(data)


@pytest.mark.skipif(CHROMIUM is None, reason=SKIP_REASON)
def test_html_report_runs_nothing_hostile_in_chromium(hostile_run, capsys):
    root, html = hostile_run
    assert main(["diagnose", str(root), "--html", str(html)]) in (0, 1)
    capsys.readouterr()
    assert "&lt;script&gt;window.__pwned=1" in html.read_text(encoding="utf-8")  # shown, escaped
    proc = dump_dom(html)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.count('<svg class="chart"') >= 2  # the charts are there, drawn without script
    assert hostile_traces(proc) == []
