"""Every doctor rule and every preflight check on its own small fixtures: one folder
per code under tests/rules/, holding cases that must fire (named `fire*`) and twins
that must stay silent (`silent*`). Seconds in all, no training.

A case is a file or a folder (probe records, logs, a script, a rank table). An
optional `cases.json` in the code's folder adds what a case expects, by case name:

- `input`: the path to use, relative to the code's folder, when the case is not a
  file of its own (the shared clean run, a public log of the corpus, or a sibling
  rule's fire case as a near miss: `silent_near`);
- doctor rules: `top` (the code is the first finding), `ranks`, `step`, `baseline`
  (a baseline run folder, relative to the code's folder: `diagnose --baseline`);
- preflight checks: `lines` (the lines this code's findings are at), `rank_table`
  (the input is given as `--rank-table`), `environ` (the launch environment),
  `compare` (manifests to compare). A script's expected findings are its
  `# expect: CODE` comments, all codes together: its silent twin expects none.

Every fire case also keeps the text of its finding (title, ranks, step, tensor,
evidence and fix; for a preflight check its rendered lines) in
`CODE/snapshots/CASE.txt`, compared here, so a change of wording shows in review.
After changing a rule's text on purpose, refresh them and review the diff:

    SYNCDOCTOR_UPDATE_SNAPSHOTS=1 .venv/bin/python -m pytest tests/rules -q
    git diff tests/rules/*/snapshots
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from syncdoctor.doctor.diagnose import diagnose
from syncdoctor.doctor.model import Diagnosis, Finding
from syncdoctor.doctor.rules import all_rules
from syncdoctor.preflight import run_preflight
from syncdoctor.preflight.model import PreflightFinding
from syncdoctor.preflight.registry import all_checks

HERE = Path(__file__).resolve().parent
CODE_DIR = re.compile(r"^(SD|PF)\d{3}$")
_EXPECT = re.compile(r"#\s*expect:\s*(PF\d{3})")
UPDATE_SNAPSHOTS = os.environ.get("SYNCDOCTOR_UPDATE_SNAPSHOTS") == "1"


@dataclass(frozen=True)
class Case:
    code: str
    name: str
    path: Path
    options: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)

    @property
    def fires(self) -> bool:
        return self.name.startswith("fire")

    def __str__(self) -> str:
        return f"{self.code}/{self.name}"


def code_folders() -> list[Path]:
    return sorted(p for p in HERE.iterdir() if p.is_dir() and CODE_DIR.match(p.name))


def cases_of(folder: Path) -> list[Case]:
    spec_file = folder / "cases.json"
    spec: dict[str, dict[str, Any]] = json.loads(spec_file.read_text()) if spec_file.exists() else {}
    names = {p.name for p in folder.iterdir() if p.name.startswith(("fire", "silent"))} | set(spec)
    cases = []
    for name in sorted(names):
        options = spec.get(name, {})
        cases.append(Case(folder.name, name, (folder / options.get("input", name)).resolve(), options))
    return cases


ALL_CASES = [case for folder in code_folders() for case in cases_of(folder)]


@cache
def diagnosis(path: Path, baseline: Path | None = None) -> Diagnosis:
    return diagnose([path], baseline=[baseline] if baseline else None)


def preflight(case: Case) -> list[PreflightFinding]:
    opts = case.options
    folder = HERE / case.code
    compare = [folder / p for p in opts.get("compare", [])]
    if opts.get("rank_table"):
        return run_preflight([], case.path, environ=opts.get("environ"))
    paths = [case.path] if case.path.exists() else []  # a comparison alone has no path of its own
    return run_preflight(paths, compare=compare, environ=opts.get("environ"))


def script_expectations(path: Path) -> set[tuple[str, int, str]]:
    files = sorted(path.rglob("*.py")) if path.is_dir() else [path]
    return {
        (str(f), n, m.group(1))
        for f in files
        for n, line in enumerate(f.read_text().splitlines(), 1)
        if (m := _EXPECT.search(line))
    }


@pytest.mark.parametrize("case", ALL_CASES, ids=str)
def test_case(case: Case) -> None:
    assert case.path.exists() or case.options.get("compare"), f"{case}: {case.path} does not exist"
    if case.code.startswith("SD"):
        check_doctor_case(case)
    else:
        check_preflight_case(case)


def check_doctor_case(case: Case) -> None:
    baseline = case.options.get("baseline")
    diag = diagnosis(case.path, (HERE / case.code / baseline).resolve() if baseline else None)
    found = {f.code: f for f in diag.findings}
    listed = [(f.code, f.confidence, f.title) for f in diag.findings]
    if not case.fires:
        assert case.code not in found, f"{case} must stay silent: {listed}"
        return
    assert case.code in found, f"{case} must fire: {listed}"
    finding = found[case.code]
    if case.options.get("top"):
        assert diag.findings[0].code == case.code, f"{case} must be the top finding: {listed}"
    if "ranks" in case.options:
        assert finding.ranks == case.options["ranks"]
    if "step" in case.options:
        assert finding.step == case.options["step"]
    assert finding.fix, f"{case}: the finding carries no fix (the rule's docstring lacks **Fix:**)"
    check_snapshot(case, finding_text(finding))


def check_preflight_case(case: Case) -> None:
    findings = preflight(case)
    if case.path.suffix == ".py" or (case.path.is_dir() and any(case.path.rglob("*.py"))):
        expected = script_expectations(case.path)
        assert {(f.path, f.line, f.code) for f in findings} == expected
        assert bool(expected) == case.fires, f"{case}: a fire case marks its lines, a silent one none"
        if case.fires:
            check_snapshot(case, "".join(_portable(f.render()) + "\n" for f in findings))
        return
    mine = [f for f in findings if f.code == case.code]
    if not case.fires:
        assert not mine, f"{case} must stay silent: {[f.render() for f in mine]}"
        return
    assert mine, f"{case} must fire: {[f.render() for f in findings]}"
    if "lines" in case.options:
        assert [f.line for f in mine] == case.options["lines"], [f.render() for f in mine]
    check_snapshot(case, "".join(_portable(f.render()) + "\n" for f in mine))


def _portable(text: str) -> str:
    """The text with this checkout's paths written relative to tests/rules/."""
    return text.replace(str(HERE) + os.sep, "").replace(str(HERE.parent) + os.sep, ".." + os.sep)


def finding_text(finding: Finding) -> str:
    lines = [f"{finding.code} {finding.title}"]
    lines += [
        f"ranks: {finding.ranks}",
        f"step: {finding.step}",
        f"tensor: {finding.tensor}",
        f"stage: {finding.stage}",
        "evidence:",
    ]
    lines += [f"- {e}" for e in finding.evidence]
    lines += ["fix:", finding.fix]
    return _portable("\n".join(lines)) + "\n"


def snapshot_path(case: Case) -> Path:
    return HERE / case.code / "snapshots" / f"{case.name}.txt"


def check_snapshot(case: Case, text: str) -> None:
    """The finding's text is the committed snapshot (SYNCDOCTOR_UPDATE_SNAPSHOTS=1 writes it)."""
    path = snapshot_path(case)
    if UPDATE_SNAPSHOTS:
        path.parent.mkdir(exist_ok=True)
        if not path.exists() or path.read_text() != text:
            path.write_text(text)
        return
    assert path.exists(), f"{case}: no snapshot {path.relative_to(HERE)} (SYNCDOCTOR_UPDATE_SNAPSHOTS=1 writes it)"
    assert path.read_text() == text, (
        f"{case}: the finding's text is not {path.relative_to(HERE)}; if the change is meant, "
        "refresh with SYNCDOCTOR_UPDATE_SNAPSHOTS=1 and commit the diff"
    )


def test_every_fire_case_has_a_snapshot_and_every_snapshot_a_fire_case() -> None:
    fire = {snapshot_path(c) for c in ALL_CASES if c.fires}
    kept = {p for folder in code_folders() for p in (folder / "snapshots").glob("*.txt")}
    assert sorted(map(str, fire - kept)) == [], "fire cases without a snapshot (SYNCDOCTOR_UPDATE_SNAPSHOTS=1)"
    assert sorted(map(str, kept - fire)) == [], "snapshots of no fire case (a case renamed or removed: delete them)"


def test_every_rule_and_check_has_a_fixture_folder_with_both_kinds_of_case() -> None:
    registered = {r.code for r in all_rules()} | {c.code for c in all_checks()}
    folders = {p.name for p in code_folders()}
    assert sorted(registered - folders) == [], "codes without a fixture folder under tests/rules/"
    assert sorted(folders - registered) == [], "fixture folders of codes that are not registered"
    for code in registered:
        kinds = {c.fires for c in ALL_CASES if c.code == code}
        assert kinds == {True, False}, f"{code} needs a case that fires and one that stays silent"


def test_every_rule_and_check_documents_itself_and_the_docstring_is_the_only_fix_text() -> None:
    rules, checks = all_rules(), all_checks()
    for entry in [*rules, *checks]:
        docs = entry.docs()
        required = ("symptom", "cause", "fix") + (("quick_check",) if entry in rules else ())
        assert all(docs.get(k) for k in required), (entry.code, [k for k in required if not docs.get(k)])
        assert "fix" not in vars(entry), f"{entry.code}: the fix is the docstring's **Fix:** section, not an attribute"
        assert docs["fix"] == entry.fix_text()
