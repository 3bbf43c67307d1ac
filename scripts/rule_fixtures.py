"""Rebuild the lab-made fixture runs of tests/rules/ (after a record format change, or
for a new rule whose fault the lab injects).

    python scripts/rule_fixtures.py SD401 SD971      # those codes' fire cases
    python scripts/rule_fixtures.py --all            # every lab-made case and the clean run

For each code: runs its lab fault (small: 60 steps, onset 20, world size 2), keeps
`records/` and `train.log*` as tests/rules/CODE/fire, applies the documented edit
for the rules whose fault the lab does not inject (a clean run with one thing
changed), and writes what the diagnosis now says (top, ranks, step) into the `fire`
entry of cases.json; the other entries are kept. Check the diff before committing:
an expectation that moved is a behaviour change.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from syncdoctor.doctor.diagnose import diagnose

RULES = Path(__file__).resolve().parents[1] / "tests" / "rules"
LAB_ARGS = ["--steps", "60", "--onset", "20", "--pg-timeout", "10"]
SOURCE = (
    "syncdoctor lab run {fault} --steps 60 --onset 20 --pg-timeout 10 (torch, gloo, world size 2, "
    "seed 0); records/ and train.log* kept"
)

# code -> (lab fault, variant)
FROM_LAB = {
    "SD101": ("lr-too-high", ""),
    "SD102": ("lr-not-scaled", ""),
    "SD201": ("duplicate-rank-id", ""),
    "SD301": ("unseeded-shuffle", ""),
    "SD302": ("shard-overlap", ""),
    "SD303": ("shuffle-after-shard", ""),
    "SD304": ("uneven-shards", ""),
    "SD401": ("dropped-rank", ""),
    "SD402": ("grad-accum-misaligned", ""),
    "SD403": ("grad-sum", ""),
    "SD501": ("init-mismatch", ""),
    "SD502": ("mode-mismatch", ""),
    "SD503": ("buffer-divergence", ""),
    "SD601": ("optimizer-state-mismatch", ""),
    "SD701": ("loss-hparam-mismatch", ""),
    "SD901": ("fp16-overflow", "local_skip"),
    "SD902": ("fp16-overflow", ""),
    "SD951": ("comm-timeout", ""),
    "SD961": ("rank-crash", ""),
    "SD971": ("bit-flip", ""),
}


def _snapshot(edit: Callable[[dict[str, Any]], None]) -> Callable[[dict[str, Any]], None]:
    return lambda rec: edit(rec) if rec["kind"] == "snapshot" else None


def _scale_local_norm(rec: dict[str, Any]) -> None:
    if rec["kind"] == "step" and rec.get("grad_norm_local"):
        rec["grad_norm_local"] *= 100


# code -> (what is changed in words, [(rank, edit of each record)])
EDITED_CLEAN = {
    "SD202": (
        "DEVICE_ID=0 written into both ranks' snapshot env (two ranks of one host on one device)",
        [(r, _snapshot(lambda rec: rec["env"].update(DEVICE_ID="0"))) for r in (0, 1)],
    ),
    "SD702": ("rank 1's grad_norm_local multiplied by 100 at every step", [(1, _scale_local_norm)]),
    "SD801": (
        "rank 1's snapshot code.entry_sha256 replaced (another version of the entry script)",
        [(1, _snapshot(lambda rec: rec["code"].update(entry_sha256="0" * 64)))],
    ),
}


def lab_run(fault: str, variant: str, out: Path) -> Path:
    cmd = [sys.executable, "-m", "syncdoctor.cli", "lab", "run", fault, *LAB_ARGS, "--out", str(out)]
    if variant:
        cmd += ["--variant", variant]
    subprocess.run(cmd, check=False, stdout=subprocess.DEVNULL)
    return out


def keep(run: Path, dst: Path) -> None:
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(run / "records", dst / "records")
    for log in run.glob("train.log*"):
        shutil.copy(log, dst / log.name)


def edit_records(run: Path, rank: int, edit: Callable[[dict[str, Any]], None]) -> None:
    path = run / "records" / f"rank{rank}.jsonl"
    out = []
    for line in path.read_text().splitlines():
        rec = json.loads(line)
        edit(rec)
        out.append(json.dumps(rec, separators=(",", ":")))
    path.write_text("\n".join(out) + "\n")


def expectations(code: str, run: Path) -> dict[str, Any]:
    diag = diagnose([run])
    found = {f.code: f for f in diag.findings}
    if code not in found:
        raise SystemExit(f"{code} does not fire on {run}: {[f.code for f in diag.findings]}")
    out: dict[str, Any] = {"top": True} if diag.findings[0].code == code else {}
    if found[code].ranks:
        out["ranks"] = found[code].ranks
    if found[code].step is not None:
        out["step"] = found[code].step
    return out


def write_fire(code: str, source: str) -> None:
    path = RULES / code / "cases.json"
    spec = json.loads(path.read_text()) if path.exists() else {}
    spec["fire"] = {"source": source, **expectations(code, RULES / code / "fire")}
    spec.setdefault("silent", {"input": "../_shared/clean-run", "source": SOURCE.format(fault="clean")})
    path.write_text(json.dumps(spec, indent=1, ensure_ascii=False) + "\n")
    print(code, spec["fire"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("codes", nargs="*")
    parser.add_argument("--all", action="store_true")
    args = parser.parse_args()
    codes = sorted(FROM_LAB) + sorted(EDITED_CLEAN) if args.all else [c.upper() for c in args.codes]
    with tempfile.TemporaryDirectory(prefix="rule-fixtures-") as tmp:
        clean = None
        if args.all or any(c in EDITED_CLEAN for c in codes):
            clean = lab_run("clean", "", Path(tmp) / "clean")
            if args.all:
                keep(clean, RULES / "_shared" / "clean-run")
        for code in codes:
            if code in FROM_LAB:
                fault, variant = FROM_LAB[code]
                keep(lab_run(fault, variant, Path(tmp) / code), RULES / code / "fire")
                write_fire(code, SOURCE.format(fault=f"{fault} --variant {variant}" if variant else fault))
            elif code in EDITED_CLEAN and clean is not None:
                what, edits = EDITED_CLEAN[code]
                keep(clean, RULES / code / "fire")
                for rank, edit in edits:
                    edit_records(RULES / code / "fire", rank, edit)
                write_fire(code, SOURCE.format(fault="clean") + "; then " + what)
            else:
                print(f"{code}: its cases are not lab runs (logs of the corpus or hand-written); nothing to do")


if __name__ == "__main__":
    main()
