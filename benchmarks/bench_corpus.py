"""Benchmark: the log-only doctor on the corpus of real public cases (tests/corpus/).

For every case it runs ``syncdoctor.doctor.diagnose`` on the case's verbatim log and
takes the top category: the category of the first error- or warning-severity
finding, or "healthy" when there is none. A case is right when that category is
one of the categories an expert would accept for it. Printed per part of the fixed
split (dev: tuned on; test: sha256(id) % 3 == 0, never tuned on):

* top-1 accuracy, and the same for a five-line keyword classifier (the floor);
* false alarms: healthy runs with an error-severity finding (must be none);
* a confusion matrix (confirmed category -> predicted top category);
* with --show-wrong, the cases still wrong (id, expected, predicted).

    .venv/bin/python benchmarks/bench_corpus.py                 # both parts
    .venv/bin/python benchmarks/bench_corpus.py --part dev --show-wrong
    .venv/bin/python benchmarks/bench_corpus.py --json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.corpus.corpus import Case, load_cases  # noqa: E402


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
    from syncdoctor.doctor.diagnose import diagnose
    from syncdoctor.errors import InputError

    try:
        diag = diagnose([case.log_path])
    except InputError:
        return "healthy", False, "nothing to diagnose"
    serious = [f for f in diag.findings if f.severity in ("error", "warning")]
    top = serious[0].category if serious else "healthy"
    return top, any(f.severity == "error" for f in diag.findings), diag.verdict


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
    args = parser.parse_args()
    cases = [c for c in load_cases() if args.part in ("both", c.split)]
    started = time.perf_counter()
    rows = evaluate(cases)
    elapsed = time.perf_counter() - started
    parts = [p for p in ("dev", "test") if args.part in ("both", p)]
    result = {p: summary([r for r in rows if r["split"] == p]) for p in parts}
    if args.json:
        print(json.dumps({"parts": result, "seconds": round(elapsed, 2), "rows": rows}, indent=1))
        return 0
    print(f"corpus: {len(cases)} cases in {elapsed:.1f} s")
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
