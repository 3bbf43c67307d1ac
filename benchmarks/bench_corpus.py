"""Benchmark: the log-only doctor on the corpus of real public cases (tests/unit/corpus/).

For every case it runs ``syncdoctor.doctor.diagnose`` on the case's verbatim log and
takes the top category: the category of the first error- or warning-severity
finding, or "healthy" when there is none. A case is right when that category is
one of the categories an expert would accept for it. Printed per part of the fixed
split (dev: tuned on; test: sha256(id) % 3 == 0, never tuned on):

* top-1 accuracy, and the same for a five-line keyword classifier (the floor);
* false alarms: healthy runs with an error-severity finding (must be none);
* a confusion matrix (confirmed category -> predicted top category);
* with --show-wrong, the cases still wrong (id, expected, predicted).

A third part, **worldset**, is material collected outside this project (real public
cases with answers, and per-rank logs of scripts written by others): never tuned on
case by case. It is read from ``--worldset DIR`` (or ``$SYNCDOCTOR_WORLDSET``): the
fenced log blocks of each ``DIR/cases/NNN-*.md`` become one log, graded against
``DIR/cases/answers.json`` (``accept``; ``ranks`` where the culprit must be named);
``--worldset-logs SET=LOGDIR`` adds the per-rank logs a set's ``run_all.sh`` wrote
(``train.log*``/``stderr.log*``, or msrun's ``*.log``), graded against
``DIR/SET/answers.json``. Inputs answered with an input error (exit 2) are counted.

    .venv/bin/python benchmarks/bench_corpus.py                 # dev and test
    .venv/bin/python benchmarks/bench_corpus.py --part dev --show-wrong
    .venv/bin/python benchmarks/bench_corpus.py --worldset ../shared/worldset \
        --worldset-logs torch2=/tmp/logs_t2 --worldset-logs mindspore2=/tmp/logs_ms2
    .venv/bin/python benchmarks/bench_corpus.py --json
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.unit.corpus.corpus import Case, load_cases  # noqa: E402


def keyword_floor(text: str) -> str:
    """The floor: what grep and five keywords would say."""
    low = text.lower()
    if "out of memory" in low or "oom" in low:
        return "process.crash"
    if "timeout" in low or "timed out" in low:
        return "comm.fault"
    if "nan" in low or "overflow" in low:
        return "numeric.overflow"
    return "process.crash" if ("error" in low or "exception" in low) else "healthy"


def doctor_top(case: Case) -> tuple[str, bool, str]:
    """(top category, any error-severity finding, verdict) for one case."""
    top, error, verdict, _ = diagnose_top([case.log_path])
    return top, error, verdict


def diagnose_top(paths: list[Path]) -> tuple[str, bool, str, list[int]]:
    """(top category, any error-severity finding, verdict, the top finding's ranks)."""
    from syncdoctor.doctor.diagnose import diagnose
    from syncdoctor.errors import InputError

    try:
        diag = diagnose(paths)
    except InputError:
        return "healthy", False, "nothing to diagnose", []
    serious = [f for f in diag.findings if f.severity in ("error", "warning")]
    top = serious[0].category if serious else "healthy"
    return top, any(f.severity == "error" for f in diag.findings), diag.verdict, (serious[0].ranks if serious else [])


_FENCED = re.compile(r"```[a-z]*\n(.*?)```", re.S)


def _graded(name: str, split: str, paths: list[Path], answer: dict, text: str) -> dict:
    top, error, verdict, ranks = diagnose_top(paths)
    accept = answer["accept"]
    right = top in accept
    if right and "ranks" in answer:
        right = sorted(ranks) == sorted(answer["ranks"])
    if right and answer.get("no_culprit"):
        right = len(ranks) != 1
    floor = keyword_floor(text)
    return {
        "id": name,
        "split": split,
        "expected": accept,
        "predicted": top,
        "right": right,
        "verdict": verdict,
        "false_alarm": accept == ["healthy"] and error,
        "floor": floor,
        "floor_right": floor in accept,
    }


def evaluate_worldset(root: Path, logsets: list[str]) -> list[dict]:
    """The worldset part: its public cases, and the per-rank logs of its scripts."""
    rows = []
    answers = json.loads((root / "cases" / "answers.json").read_text())
    answers.pop("_about", None)
    with tempfile.TemporaryDirectory() as tmp:
        for cid, answer in sorted(answers.items()):
            md = next((root / "cases").glob(f"{cid}-*.md"))
            text = "\n".join(_FENCED.findall(md.read_text(encoding="utf-8")))
            log = Path(tmp) / f"case{cid}.log"
            log.write_text(text, encoding="utf-8")
            rows.append(_graded(f"cases/{cid}", "worldset", [log], answer, text))
    for spec in logsets:
        name, _, logdir = spec.partition("=")
        answers = json.loads((root / name / "answers.json").read_text())
        for case, answer in sorted(answers.items()):
            folder = Path(logdir) / case
            files = sorted(folder.glob("train.log*")) + sorted(folder.glob("stderr.log*")) or sorted(
                folder.glob("*.log")
            )
            if not files:
                continue
            text = "\n".join(f.read_text(encoding="utf-8", errors="replace") for f in files)
            rows.append(_graded(f"{name}/{case}", f"worldset:{name}", files, answer, text))
    return rows


def evaluate(cases: list[Case]) -> list[dict]:
    rows = []
    for case in cases:
        top, error, verdict = doctor_top(case)
        text = case.log_path.read_text(encoding="utf-8", errors="replace")
        floor = keyword_floor(text)
        rows.append(
            {
                "id": case.id,
                "split": case.split,
                "expected": case.categories,
                "predicted": top,
                "right": top in case.categories,
                "verdict": verdict,
                "false_alarm": case.healthy and error,
                "floor": floor,
                "floor_right": floor in case.categories,
            }
        )
    return rows


def summary(rows: list[dict]) -> dict:
    n = len(rows)
    healthy = [r for r in rows if r["expected"][0] == "healthy"]
    return {
        "cases": n,
        "healthy": len(healthy),
        "top1": sum(r["right"] for r in rows) / n if n else 0.0,
        "floor_top1": sum(r["floor_right"] for r in rows) / n if n else 0.0,
        "false_alarms": [r["id"] for r in healthy if r["false_alarm"]],
        "input_errors": [r["id"] for r in rows if r["verdict"] == "nothing to diagnose"],
    }


def confusion(rows: list[dict], key: str) -> str:
    counts = Counter((r["expected"][0], r[key]) for r in rows)
    labels = sorted({a for a, _ in counts} | {b for _, b in counts})
    short = {label: label.split(".")[-1][:9] for label in labels}
    width = max(len(label) for label in labels)
    lines = [" " * width + " " + " ".join(f"{short[c]:>9}" for c in labels)]
    for a in labels:
        if any(counts[(a, b)] for b in labels):
            lines.append(f"{a:<{width}} " + " ".join(f"{counts[(a, b)] or '.':>9}" for b in labels))
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--part", choices=("dev", "test", "both"), default="both")
    parser.add_argument("--show-wrong", action="store_true", help="list the cases still wrong")
    parser.add_argument("--json", action="store_true")
    parser.add_argument(
        "--worldset",
        default=os.environ.get("SYNCDOCTOR_WORLDSET"),
        help="a worldset folder (cases/ and per-set answers): adds it as a third part ($SYNCDOCTOR_WORLDSET)",
    )
    parser.add_argument(
        "--worldset-logs",
        action="append",
        default=[],
        metavar="SET=LOGDIR",
        help="per-rank logs of a worldset set, as its run_all.sh wrote them (repeatable)",
    )
    args = parser.parse_args()
    cases = [c for c in load_cases() if args.part in ("both", c.split)]
    started = time.perf_counter()
    rows = evaluate(cases)
    parts = [p for p in ("dev", "test") if args.part in ("both", p)]
    if args.worldset:
        rows += evaluate_worldset(Path(args.worldset), args.worldset_logs)
        parts += sorted({r["split"] for r in rows if r["split"].startswith("worldset")})
    elapsed = time.perf_counter() - started
    result = {p: summary([r for r in rows if r["split"] == p]) for p in parts}
    if args.json:
        print(json.dumps({"parts": result, "seconds": round(elapsed, 2), "rows": rows}, indent=1))
        return 0
    print(f"corpus: {len(rows)} cases in {elapsed:.1f} s")
    print("\npart                 cases healthy  top-1  floor  false-alarms  input-errors")
    for part in parts:
        s = result[part]
        print(
            f"{part:<20} {s['cases']:>5} {s['healthy']:>7} {s['top1']:>6.1%} {s['floor_top1']:>6.1%}"
            f" {len(s['false_alarms']):>13} {len(s['input_errors']):>13}"
        )
    for part in parts:
        s = result[part]
        part_rows = [r for r in rows if r["split"] == part]
        print(f"\n== {part}: {s['cases']} cases ({s['healthy']} healthy)")
        print(f"doctor top-1:  {s['top1']:.1%}")
        print(
            f"keyword floor: {s['floor_top1']:.1%}   (doctor - floor: {100 * (s['top1'] - s['floor_top1']):+.1f} points)"
        )
        print(
            f"false alarms (error-severity finding on a healthy run): {len(s['false_alarms'])}"
            + (f" {s['false_alarms']}" if s["false_alarms"] else "")
        )
        print(
            f"input errors ('nothing to diagnose'): {len(s['input_errors'])}"
            + (f" {s['input_errors']}" if s["input_errors"] else "")
        )
        print("confusion, doctor (rows: confirmed category, columns: predicted top category):")
        print(confusion(part_rows, "predicted"))
        print("confusion, keyword floor:")
        print(confusion(part_rows, "floor"))
        if args.show_wrong:
            print("still wrong:")
            for r in part_rows:
                if not r["right"]:
                    print(f"  {r['id']}: expected {'/'.join(r['expected'])}, got {r['predicted']} ({r['verdict']})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
