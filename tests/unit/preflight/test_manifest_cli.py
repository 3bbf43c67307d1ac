from __future__ import annotations

import json
from pathlib import Path

import pytest

from syncdoctor.cli import main
from syncdoctor.preflight.manifest import load_manifest, write_manifest
from syncdoctor.preflight.registry import all_checks

RULES = Path(__file__).resolve().parents[2] / "rules"


def _tree(root: Path, loss_src: str) -> Path:
    (root / "pkg").mkdir(parents=True)
    (root / "train.py").write_text("print('train')\n")
    (root / "pkg" / "loss.py").write_text(loss_src)
    (root / "weights.bin").write_bytes(b"\0" * 100)  # not source: not hashed
    return root


def test_manifest_round_trip(tmp_path: Path) -> None:
    root = _tree(tmp_path / "code", "MARGIN = 0.05\n")
    data = write_manifest(tmp_path / "a.json", [root])
    assert set(data["files"]) == {"train.py", "pkg/loss.py"}
    m = load_manifest(tmp_path / "a.json")
    assert m.files == data["files"] and m.packages and m.python


def test_compare_shows_the_differences(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a = _tree(tmp_path / "a", "MARGIN = 0.05\n")
    b = _tree(tmp_path / "b", "MARGIN = 0.1\n")
    (b / "extra.py").write_text("")
    assert main(["preflight", "--manifest", str(tmp_path / "ma.json"), str(a)]) == 0
    assert main(["preflight", "--manifest", str(tmp_path / "mb.json"), str(b)]) == 0
    data = json.loads((tmp_path / "mb.json").read_text())
    data["packages"]["torch"] = "0.0.1"
    (tmp_path / "mb.json").write_text(json.dumps(data))
    capsys.readouterr()
    assert main(["preflight", "--compare", str(tmp_path / "ma.json"), str(tmp_path / "mb.json")]) == 1
    out = capsys.readouterr().out
    assert "PF402 pkg/loss.py differs" in out
    assert "PF401 extra.py exists on" in out
    assert "PF403 package torch differs" in out
    assert main(["preflight", "--compare", str(tmp_path / "ma.json"), str(tmp_path / "ma.json")]) == 0


def test_cli_exit_codes(tmp_path: Path, fixtures: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["preflight", str(RULES / "PF313" / "silent.py")]) == 0
    assert main(["preflight", str(RULES / "PF313" / "fire.py")]) == 1
    assert main(["preflight", str(RULES / "PF307" / "fire.py")]) == 0  # warnings only
    assert main(["preflight", str(tmp_path / "missing")]) == 2
    assert main(["preflight", "--compare", str(tmp_path / "one.json")]) == 2
    assert main(["preflight", "--no-environ", "--rank-table", str(fixtures / "rank_tables" / "three_errors.json")]) == 1
    out = capsys.readouterr().out
    assert "three_errors.json:3:5 PF101 server_count is 3 but 2 servers are listed" in out


def test_cli_json(capsys: pytest.CaptureFixture[str]) -> None:
    capsys.readouterr()
    assert main(["preflight", "--json", str(RULES / "PF305" / "fire.py")]) == 1
    data = json.loads(capsys.readouterr().out)
    assert [d["code"] for d in data] == ["PF305"] * 3
    assert set(data[0]) == {"path", "line", "col", "code", "severity", "message"}


def test_cli_list_and_explain(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["preflight", "--list"]) == 0
    assert "PF102" in capsys.readouterr().out
    assert main(["preflight", "--explain", "pf305"]) == 0
    assert "**Fix:**" in capsys.readouterr().out
    assert main(["preflight", "--explain", "PF999"]) == 2


def test_registry_metadata() -> None:
    checks = all_checks()
    assert len({c.code for c in checks}) == len(checks) >= 30
    prefixes = {"rank_table": "PF1", "env": "PF2", "script": "PF3", "manifest": "PF4"}
    for c in checks:
        assert c.code.startswith(prefixes[c.target]), c.code
        assert c.severity in ("error", "warning", "info")
        for section in ("**Symptom:**", "**Cause:**", "**Fix:**"):
            assert section in (c.__doc__ or ""), (c.code, section)
