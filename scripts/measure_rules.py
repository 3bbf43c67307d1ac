"""Measure each doctor rule: where it fired on a labelled run, was its cause the right one?

The labelled material is the project's own (docs/confidence.md says why):

- every rule's fixtures (tests/rules/SDnnn): a fire case marked ``top`` is a run of that
  rule's fault, the shared clean run is healthy;
- the corpus of public logs (tests/unit/corpus): its dev part is counted, its test part
  is held out (answers kept for the regression test, not counted);
- the lab's faults: the ``--json`` rows of ``syncdoctor lab matrix``, with their run
  folders (``--lab NAME=ROWS.json``; world sizes 2 and 4 for the committed table).

It writes the counts the doctor ranks by (src/syncdoctor/doctor/measured.json), every
case with the rules that fired on it and its answer (tests/unit/calibration_cases.json,
which tests/unit/test_calibration.py re-diagnoses), and the table in docs/confidence.md.
``--heldout NAME=RUNS:ANSWERS.json`` grades run folders that are not counted (answers as
``{case: {"accept": [...]}}``, run folders RUNS/case) under both rankings, and prints it.

    .venv/bin/syncdoctor lab matrix --world-size 2 --steps 60 --onset 20 --pg-timeout 10 --json --out /tmp/m2 > /tmp/m2.json
    .venv/bin/syncdoctor lab matrix --world-size 4 --steps 60 --onset 20 --pg-timeout 10 --json --out /tmp/m4 > /tmp/m4.json
    .venv/bin/python scripts/measure_rules.py --lab lab2=/tmp/m2.json --lab lab4=/tmp/m4.json
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from syncdoctor.doctor import calibration  # noqa: E402
from syncdoctor.doctor.diagnose import load_baseline, load_evidence, ranked, run_rules  # noqa: E402
from syncdoctor.doctor.model import Finding  # noqa: E402
from syncdoctor.doctor.rules import all_rules  # noqa: E402
from syncdoctor.errors import InputError  # noqa: E402
from syncdoctor.records import stages  # noqa: E402
from tests.rules.test_rule_cases import ALL_CASES  # noqa: E402
from tests.unit.corpus.corpus import load_cases  # noqa: E402

CASES_FILE = ROOT / "tests" / "unit" / "calibration_cases.json"
DOC = ROOT / "docs" / "confidence.md"
TABLE_START = "<!-- measured table: scripts/measure_rules.py writes it -->"
TABLE_END = "<!-- end of measured table -->"
SHARED_CLEAN = (ROOT / "tests" / "rules" / "_shared" / "clean-run").resolve()


@dataclass
class Labelled:
    name: str  # source/case, e.g. rules/SD402/fire, corpus/<id>, lab2/grad-sum-s0
    source: str
    paths: list[Path]
    accept: list[str]
    counted: bool = True
    baseline: Path | None = None
    fired: list[Finding] = field(default_factory=list)


def fixture_cases() -> list[Labelled]:
    rules = {r.code: r for r in all_rules()}
    out: dict[Path, Labelled] = {}
    for case in ALL_CASES:
        if case.code not in rules:
            continue  # a preflight check
        base = case.options.get("baseline")
        baseline = (ROOT / "tests" / "rules" / case.code / base).resolve() if base else None
        if case.fires and case.options.get("top"):
            accept = [rules[case.code].category]
        elif case.path == SHARED_CLEAN:
            accept = ["healthy"]
        else:
            continue  # a silent twin or a fire case whose top cause is not stated
        key = case.path if baseline is None else case.path / str(base)
        out.setdefault(key, Labelled(f"rules/{case}", "rules", [case.path], accept, baseline=baseline))
    return list(out.values())


def corpus_cases() -> list[Labelled]:
    return [
        Labelled(f"corpus/{c.id}", f"corpus-{c.split}", [c.log_path], list(c.categories), counted=c.split == "dev")
        for c in load_cases()
    ]


def lab_cases(name: str, rows_file: Path) -> list[Labelled]:
    rows = json.loads(rows_file.read_text())
    return [
        Labelled(f"{name}/{Path(r['out']).name}", name, [Path(r["out"])], [r["expected"]])
        for r in rows  # a run that failed is a case too (a crash, a hang: the fault's own)
    ]


def heldout_cases(spec: str) -> list[Labelled]:
    name, _, rest = spec.partition("=")
    runs, _, answers_file = rest.rpartition(":")
    answers = json.loads(Path(answers_file).read_text())
    return [
        Labelled(f"{name}/{case}", name, [Path(runs) / case], list(a["accept"]), counted=False)
        for case, a in sorted(answers.items())
        if isinstance(a, dict) and "accept" in a and (Path(runs) / case).exists()
    ]


def observe(case: Labelled) -> None:
    """The findings every rule gives, each at its own estimate (ranking does not decide
    which rules fire, so one diagnosis serves both rankings)."""
    try:
        ev = load_evidence(case.paths)
        if case.baseline is not None:
            load_baseline(ev, [case.baseline])
        case.fired = run_rules(ev, calibrate=False)
    except InputError:
        case.fired = []


def serious(findings: list[Finding]) -> list[Finding]:
    return [f for f in findings if f.severity in ("error", "warning")]


def answer(findings: list[Finding], counts: dict[str, tuple[int, int]] | None) -> str:
    """The top cause's category under the estimates (None) or the measured counts."""
    if counts is not None:
        findings = ranked([calibration.calibrated(f, counts) for f in findings])
    top = serious(findings)
    return top[0].category if top else "healthy"


def count(cases: list[Labelled]) -> dict[str, dict[str, object]]:
    per_rule: dict[str, dict[str, list[int]]] = defaultdict(lambda: defaultdict(lambda: [0, 0]))
    for case in cases:
        if not case.counted:
            continue
        for f in serious(case.fired):
            tally = per_rule[f.code][case.source]
            tally[0] += f.category in case.accept
            tally[1] += 1
    return {
        code: {
            "right": sum(t[0] for t in by.values()),
            "fired": sum(t[1] for t in by.values()),
            "by_source": {src: by[src] for src in sorted(by)},
        }
        for code, by in sorted(per_rule.items())
    }


def doc_table(rules: dict[str, dict[str, object]]) -> str:
    """The docs' table: one row per rule, in stage order."""
    estimates = {r.code: r for r in all_rules()}
    lines = [
        "| rule | stage | right / fired | measured | by source (right/fired) |",
        "|---|---|---|---|---|",
    ]
    for code in sorted(estimates, key=lambda c: (stages.order(estimates[c].stage), c)):
        row = rules.get(code)
        stage = stages.name(estimates[code].stage) or estimates[code].stage
        if row is None:
            lines.append(f"| {code} {estimates[code].name} | {stage} | — | not measured: the rule's estimate | |")
            continue
        right, fired = int(row["right"]), int(row["fired"])  # type: ignore[call-overload]
        by = ", ".join(f"{s} {t[0]}/{t[1]}" for s, t in row["by_source"].items())  # type: ignore[attr-defined]
        lines.append(
            f"| {code} {estimates[code].name} | {stage} | {right} / {fired} | {100 * right / fired:.0f} % | {by} |"
        )
    return "\n".join(lines)


def write_doc_table(table: str) -> None:
    text = DOC.read_text(encoding="utf-8")
    head, _, rest = text.partition(TABLE_START)
    _, _, tail = rest.partition(TABLE_END)
    DOC.write_text(f"{head}{TABLE_START}\n{table}\n{TABLE_END}{tail}", encoding="utf-8")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lab", action="append", default=[], metavar="NAME=ROWS.json")
    parser.add_argument("--heldout", action="append", default=[], metavar="NAME=RUNS:ANSWERS.json")
    parser.add_argument("--dry-run", action="store_true", help="print, write nothing")
    args = parser.parse_args()

    cases = fixture_cases() + corpus_cases()
    for spec in args.lab:
        name, _, rows = spec.partition("=")
        cases += lab_cases(name, Path(rows))
    for spec in args.heldout:
        cases += heldout_cases(spec)
    for case in cases:
        observe(case)
    rules = count(cases)
    counts = {code: (int(r["right"]), int(r["fired"])) for code, r in rules.items()}  # type: ignore[call-overload]

    by_source: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])  # right before, right after, cases
    rows = {}
    for case in cases:
        before, after = answer(case.fired, None), answer(case.fired, counts)
        tally = by_source[case.source]
        tally[0] += before in case.accept
        tally[1] += after in case.accept
        tally[2] += 1
        if before in case.accept and after not in case.accept:
            print(f"right at the estimates, wrong measured: {case.name} ({before} -> {after}, accept {case.accept})")
        if after in case.accept and before not in case.accept:
            print(f"wrong at the estimates, right measured: {case.name} ({before} -> {after}, accept {case.accept})")
        if case.source in ("rules", "corpus-dev", "corpus-test"):
            rows[case.name] = {
                "accept": case.accept,
                "fired": sorted(f.code for f in serious(case.fired)),
                "answer": after,
                "right": after in case.accept,
            }
    print(f"{'source':14s} {'cases':>5s} {'estimates':>10s} {'measured':>9s}  counted")
    for source, (right_before, right_after, n) in sorted(by_source.items()):
        counted = any(c.counted for c in cases if c.source == source)
        print(f"{source:14s} {n:5d} {right_before:10d} {right_after:9d}  {'yes' if counted else 'held out'}")
    if args.dry_run:
        return 0
    about = "written by scripts/measure_rules.py: per rule, labelled runs where it fired and its cause was right"
    sources = sorted({c.source for c in cases if c.counted})
    calibration.MEASURED_FILE.write_text(
        json.dumps({"about": about, "sources": sources, "rules": rules}, indent=1) + "\n", encoding="utf-8"
    )
    CASES_FILE.write_text(json.dumps(rows, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    write_doc_table(doc_table(rules))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
