"""Measured confidences (doctor/calibration.py, docs/confidence.md): the answers that
were right when the rules were measured stay right, the rules that fire on a case are
the ones measured, and a rule that fires on other faults' consequences ranks below one
that fires on its own cause."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

import pytest

from syncdoctor.doctor.calibration import PRIOR_WEIGHT, calibrated, measured_counts
from syncdoctor.doctor.diagnose import diagnose, ranked
from syncdoctor.doctor.model import Finding, confidence_text
from syncdoctor.doctor.rules import all_rules
from syncdoctor.errors import InputError
from syncdoctor.records import stages
from tests.rules.test_rule_cases import ALL_CASES
from tests.rules.test_rule_cases import HERE as RULES_DIR
from tests.unit.corpus.corpus import load_cases

HERE = Path(__file__).resolve().parent
CASES = json.loads((HERE / "calibration_cases.json").read_text(encoding="utf-8"))
DOC = HERE.parent.parent / "docs" / "confidence.md"
FIXTURES = {f"rules/{case}": case for case in ALL_CASES}
CORPUS = {f"corpus/{case.id}": case for case in load_cases()}
RERUN = "rerun scripts/measure_rules.py (docs/confidence.md) and read what it prints"


@cache
def observed(name: str) -> tuple[str, tuple[str, ...]]:
    """(the answer, the codes that fired as errors or warnings) as the doctor gives them now."""
    if name in FIXTURES:
        case = FIXTURES[name]
        base = case.options.get("baseline")
        paths, baseline = [case.path], [(RULES_DIR / case.code / base).resolve()] if base else None
    else:
        paths, baseline = [CORPUS[name].log_path], None
    try:
        findings = diagnose(paths, baseline=baseline).findings
    except InputError:
        return "healthy", ()
    serious = [f for f in findings if f.severity in ("error", "warning")]
    return (serious[0].category if serious else "healthy"), tuple(sorted(f.code for f in serious))


@pytest.mark.parametrize("name", sorted(CASES))
def test_an_answer_that_was_right_stays_right(name: str) -> None:
    measured = CASES[name]
    answer, fired = observed(name)
    assert list(fired) == measured["fired"], f"{name}: rules fired {list(fired)}, measured {measured['fired']}: {RERUN}"
    if measured["right"]:
        assert answer in measured["accept"], f"{name}: was right ({measured['answer']}), now {answer}"


def test_the_table_covers_what_it_must() -> None:
    names = set(CASES)
    assert {n for n in names if n.startswith("corpus/")} == set(CORPUS), f"the corpus changed: {RERUN}"
    assert sum(n.startswith("rules/") for n in names) >= 50
    counts = measured_counts()
    assert counts, "src/syncdoctor/doctor/measured.json is missing or empty"
    assert set(counts) <= {r.code for r in all_rules()}, f"a measured rule no longer exists: {RERUN}"


def test_the_docs_table_is_the_measurement() -> None:
    text = DOC.read_text(encoding="utf-8")
    for rule in all_rules():
        stage = stages.name(rule.stage) or rule.stage
        if rule.code in measured_counts():
            right, fired = measured_counts()[rule.code]
            row = f"| {rule.code} {rule.name} | {stage} | {right} / {fired} | {100 * right / fired:.0f} % |"
        else:
            row = f"| {rule.code} {rule.name} | {stage} | — | not measured"
        assert row in text, f"docs/confidence.md lacks {row!r}: {RERUN}"


def _finding(code: str, confidence: float, severity: str = "error") -> Finding:
    return Finding(code=code, category="x", severity=severity, confidence=confidence, title=code)  # type: ignore[arg-type]


def test_the_measured_confidence_is_the_estimate_weighed_against_the_count() -> None:
    counts = {"SD900": (9, 10), "SD901": (1, 10)}
    cause, consequence = calibrated(_finding("SD900", 0.95), counts), calibrated(_finding("SD901", 0.9), counts)
    assert cause.confidence == round((9 + PRIOR_WEIGHT * 0.95) / (10 + PRIOR_WEIGHT), 2)
    assert consequence.confidence == round((1 + PRIOR_WEIGHT * 0.9) / (10 + PRIOR_WEIGHT), 2)
    assert cause.measured == [9, 10]
    # a measurement never raises an estimate: the labelled runs show each rule's own fault
    assert calibrated(_finding("SD900", 0.5), counts).confidence == 0.5
    # the consequence's rule estimated itself higher; the count ranks it below
    assert [f.code for f in ranked([consequence, cause])] == ["SD900", "SD901"]
    unmeasured, note = calibrated(_finding("SD999", 0.7), counts), calibrated(_finding("SD900", 0.3, "info"), counts)
    assert (unmeasured.confidence, unmeasured.measured) == (0.7, None)
    assert (note.confidence, note.measured) == (0.3, None)
    assert "right in 9 of 10 labelled runs" in confidence_text(cause, "91")
    assert "not measured" in confidence_text(unmeasured, "70")


def test_a_rule_that_reads_consequences_is_measured_below_its_estimate() -> None:
    """SD504 (the canary parted) fires on most faults that part the replicas: the table
    must show it right less often than it fires, or the measurement measured nothing."""
    right, fired = measured_counts()["SD504"]
    assert fired >= 3 and right / fired < 0.5
