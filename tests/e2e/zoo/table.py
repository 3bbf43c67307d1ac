"""Print the zoo's table (docs/zoo.md) from kept run folders:
`SYNCDOCTOR_ZOO_DIR=/tmp/zoo pytest tests/e2e/zoo -m slow; python -m tests.e2e.zoo.table /tmp/zoo`."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from tests.e2e.zoo.conftest import diagnose_json
from tests.e2e.zoo.scenarios import PROGRAMS, SCENARIOS, Expected


def _expected(e: Expected) -> str:
    if e.category is None:
        return "healthy"
    step = (
        "whole run"
        if e.steps is None
        else (str(e.steps[0]) if e.steps[0] == e.steps[1] else f"{e.steps[0]}–{e.steps[1]}")
    )
    ranks = ",".join(map(str, e.ranks)) if e.ranks else "?"
    return f"{e.category} · step {step} · ranks {ranks}"


def _observed(root: Path, program: str, bug: str, mode: str) -> str:
    saved = root / f"{program}-{bug or 'healthy'}-{mode}" / "result.json"
    if not saved.exists():
        return "not run"
    folder = Path(json.loads(saved.read_text())["folder"])
    _, diag = diagnose_json(folder)
    if diag is None:
        return "no diagnosis"
    findings = diag["findings"]
    if not findings:
        return diag["verdict"]
    top = findings[0]
    ranks = ",".join(map(str, top["ranks"]))
    return f"{top['code']} {top['category']} · step {top['step']} · ranks {ranks}"


def main(root: Path) -> None:
    print("| framework | scenario | the bug | expected | zero-code (`syncdoctor run`) | attach | source |")
    print("|---|---|---|---|---|---|---|")
    for (program, bug), e in SCENARIOS.items():
        cells = [
            PROGRAMS[program].framework,
            bug or "healthy",
            e.what or "—",
            _expected(e),
            _observed(root, program, bug, "zero"),
            _observed(root, program, bug, "attach"),
            e.source or "—",
        ]
        print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
