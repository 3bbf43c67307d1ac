"""Byte-identity of `syncdoctor diagnose --json` (and its exit code) between two
source trees, over every run folder and log the tests use: the rule fixtures
(tests/rules/*/*, with their baselines), the corpus (tests/unit/corpus/cases/*.log)
and the log fixtures (tests/fixtures/logs/*).

    python scripts/compare_diagnose.py --base /work/main/src --new src [--twice]

The inputs are copied (times kept) into a scratch folder first, so a columnar cache
written by one tree is never read by the other, and the repository is left alone.
``--twice`` diagnoses every input twice with the new tree (a cold then a warm cache)
and compares both to the base. Each tree runs in one worker process that calls the
CLI in turn, for speed. Exit 1 on any difference, listing them.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

_WORKER = r"""
import contextlib, hashlib, io, json, os, sys
from syncdoctor.cli.app import main
jobs = json.loads(sys.stdin.read())
out = []
for argv in jobs:
    buf, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(err):
        try:
            rc = main(argv)
        except SystemExit as exc:
            rc = exc.code
        except Exception as exc:
            rc = "exception " + type(exc).__name__ + ": " + str(exc)
    text = buf.getvalue()
    out.append({"rc": rc, "sha": hashlib.sha256(text.encode()).hexdigest(), "text": text})
sys.stdout.write(json.dumps(out))
"""


def inputs(scratch: Path) -> list[list[str]]:
    """The argv of every diagnosis to compare, with paths inside ``scratch``."""
    shutil.copytree(
        ROOT / "tests", scratch / "tests", symlinks=True, ignore=shutil.ignore_patterns("__pycache__", ".syncdoctor")
    )
    jobs: list[list[str]] = []
    rules = scratch / "tests" / "rules"
    for cases_file in sorted(rules.glob("*/cases.json")):
        folder = cases_file.parent
        if folder.name.startswith("PF"):  # preflight checks: no diagnosis
            continue
        for name, options in json.loads(cases_file.read_text()).items():
            path = (folder / options.get("input", name)).resolve()
            if not path.exists():
                continue
            argv = ["diagnose", "--json", str(path)]
            if options.get("baseline"):
                argv += ["--baseline", str((folder / options["baseline"]).resolve())]
            jobs.append(argv)
    for shared in sorted((rules / "_shared").iterdir()):
        jobs.append(["diagnose", "--json", str(shared)])
    for log in sorted((scratch / "tests" / "unit" / "corpus" / "cases").glob("*.log")):
        jobs.append(["diagnose", "--json", str(log)])
    for item in sorted((scratch / "tests" / "fixtures" / "logs").iterdir()):
        jobs.append(["diagnose", "--json", str(item)])
    unique: dict[str, list[str]] = {json.dumps(j): j for j in jobs}
    return list(unique.values())


def run_tree(src: Path, jobs: list[list[str]], env_extra: dict[str, str]) -> list[dict[str, object]]:
    env = {**os.environ, "PYTHONPATH": str(src), "POLARS_MAX_THREADS": "2", **env_extra}
    proc = subprocess.run(
        [sys.executable, "-c", _WORKER], input=json.dumps(jobs), capture_output=True, text=True, env=env, check=True
    )
    return json.loads(proc.stdout)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--base", type=Path, required=True, help="the reference tree's src folder")
    parser.add_argument("--new", type=Path, default=ROOT / "src")
    parser.add_argument("--twice", action="store_true", help="new tree: a cold then a warm cache run")
    parser.add_argument("--show", action="store_true", help="print the first differing outputs")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="sd-compare-") as tmp:
        base_dir, new_dir = Path(tmp) / "base", Path(tmp) / "new"
        base_jobs = inputs(base_dir)
        new_jobs = inputs(new_dir)
        base = run_tree(args.base.resolve(), base_jobs, {"SYNCDOCTOR_RECORDS_CACHE": "0"})
        rounds = {"new": run_tree(args.new.resolve(), new_jobs, {})}
        if args.twice:
            rounds["new (warm)"] = run_tree(args.new.resolve(), new_jobs, {})
    bad = 0
    for label, results in rounds.items():
        for argv, a, b in zip(base_jobs, base, results, strict=True):
            a_text = str(a["text"]).replace(str(base_dir), "<scratch>")
            b_text = str(b["text"]).replace(str(new_dir), "<scratch>")
            if a["rc"] != b["rc"] or a_text != b_text:
                bad += 1
                print(f"DIFFERS ({label}): {' '.join(argv[2:])}".replace(str(new_dir), "").replace(str(base_dir), ""))
                print(f"  exit {a['rc']} vs {b['rc']}")
                if args.show and bad <= 3:
                    for line in _diff(a_text, b_text):
                        print("  " + line)
    digest = hashlib.sha256(json.dumps([r["sha"] for r in base]).encode()).hexdigest()[:12]
    print(f"{len(base_jobs)} diagnoses × {len(rounds)} round(s) compared; {bad} differ (base outputs {digest})")
    return 1 if bad else 0


def _diff(a: str, b: str) -> list[str]:
    import difflib

    return list(difflib.unified_diff(a.splitlines(), b.splitlines(), lineterm="", n=1))[:40]


if __name__ == "__main__":
    sys.exit(main())
