"""The bit-flip variants' measured effects, with and without heal, against the clean
baseline's seed-to-seed spread (the table in docs/hardware.md and the lab catalog).

    python benchmarks/bitflip_effects.py [--world-size 4] [--steps 150] [--out runs/bitflip] [--only NAME ...]

Every case is a real lab run (N processes over gloo on loopback) followed by the
doctor. Per case: the last-10-step mean loss (over ranks), held-out accuracy, the
largest deviation of the mean loss curve from the clean run of the same seed after
the onset (the lab is deterministic per seed), the first mismatch the live check
reported, whether the replicas were still parted at the end, the heals, and the
doctor's top finding. JSON lines go to OUT/effects.jsonl as each case ends.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

import polars as pl

from syncdoctor.doctor.diagnose import diagnose
from syncdoctor.lab.faults import FAULTS
from syncdoctor.lab.runner import run_lab
from syncdoctor.records import read_run

ONSET = 40
CHECK_EVERY = 10


def mean_loss_curve(out: Path) -> pl.DataFrame:
    return read_run(out).steps.group_by("step").agg(pl.col("loss").mean()).sort("step")


FINAL_STEPS = 30  # the final loss: the mean over ranks and the last this many steps (one step's is noisy)


def final_loss_of(curve: pl.DataFrame) -> float | None:
    last = curve.tail(FINAL_STEPS)["loss"].to_list()
    return sum(last) / len(last) if last and all(v is not None for v in last) else None


def heal_rows(out: Path) -> list[dict[str, Any]]:
    """A heal is recorded by every rank, a refusal by the rank that read the check: one row each."""
    rows, seen = [], set()
    events = [e for e in read_run(out).events if e.get("event") == "heal"]
    for e in sorted(events, key=lambda e: (e["step"], e["rank"])):
        key = (e["heal"].get("status"), e["heal"].get("id"), e["heal"].get("reason"))
        if key not in seen:
            seen.add(key)
            rows.append({"step": e["step"], **{k: e["heal"].get(k) for k in ("status", "odd", "source", "bytes",
                                                                                "seconds", "reason")}})
    return rows


def measure(name: str, fault: str, variant: str, world_size: int, steps: int, seed: int, on_mismatch: str | None,
            root: Path, clean: dict[int, pl.DataFrame]) -> dict[str, Any]:
    out = root / name
    result = run_lab(fault, variant=variant, world_size=world_size, steps=steps, onset=ONSET, seed=seed, out=out,
                     check_every=CHECK_EVERY, on_mismatch=on_mismatch, pg_timeout_s=20.0)
    records = read_run(out)
    steps_frame = records.steps
    curve = mean_loss_curve(out)
    final_loss = final_loss_of(curve)
    row: dict[str, Any] = {"case": name, "fault": fault, "variant": variant, "world_size": world_size,
                           "seed": seed, "on_mismatch": on_mismatch or "warn", "ok": result.ok,
                           "duration_s": round(result.duration_s, 1), "final_loss": final_loss,
                           "nonfinite_loss_steps": int(steps_frame["loss"].null_count()),
                           "accuracy_mean": (sum(result.accuracy.values()) / len(result.accuracy)
                                             if result.accuracy else None),
                           "accuracy_min": min(result.accuracy.values()) if result.accuracy else None}
    if seed in clean and fault != "clean":
        joined = curve.join(clean[seed], on="step", suffix="_clean").filter(pl.col("step") >= ONSET)
        dev = (joined["loss"] - joined["loss_clean"]).abs() / joined["loss_clean"].abs()
        row["max_rel_loss_deviation"] = None if dev.null_count() or dev.is_nan().any() else float(dev.max())
    mismatches = sorted((c for c in records.checks if c.get("status") == "mismatch"), key=lambda c: c["step"])
    if mismatches:
        first = mismatches[0]
        row["first_mismatch"] = {k: first.get(k) for k in ("step", "what", "ranks", "tensor")}
    measured = steps_frame.filter(pl.col("param_fp").is_not_null())
    per_step = measured.group_by("step").agg(pl.col("param_fp").n_unique().alias("k")).sort("step")
    row["parted_at_end"] = bool(per_step["k"][-1] > 1) if per_step.height else None
    row["heals"] = heal_rows(out)
    healed = [h["step"] for h in row["heals"] if h["status"] == "healed"]
    if healed:
        after = per_step.filter(pl.col("step") > max(healed))
        row["equal_at_every_check_after_heal"] = bool(after.height and (after["k"] == 1).all())
    diag = diagnose([out])
    top = diag.findings[0] if diag.findings else None
    row["doctor"] = {"category": top.category if top else "healthy", "code": top.code if top else "",
                     "ranks": top.ranks if top else [], "step": top.step if top else None,
                     "tensor": top.tensor if top else None, "title": top.title if top else ""}
    return row


def cases(world_size: int) -> list[tuple[str, str, str, int, str | None]]:
    out: list[tuple[str, str, str, int, str | None]] = [(f"clean-s{s}", "clean", "", s, None) for s in (0, 1, 2)]
    for variant in FAULTS["bit-flip"].variants:
        out.append((f"bit-flip-{variant}", "bit-flip", variant, 0, None))
        out.append((f"bit-flip-{variant}-heal", "bit-flip", variant, 0, "heal"))
    out += [(f"bit-flip-param-heal-s{s}", "bit-flip", "param", s, "heal") for s in (1, 2)]
    for fault in ("optimizer-state-mismatch", "skipped-step", "dropped-rank", "init-mismatch", "duplicate-rank-id"):
        out.append((f"{fault}-heal", fault, "", 0, "heal"))
    return out


def table(root: Path) -> str:
    """The effect table (Markdown) from OUT/effects.jsonl."""
    rows = [json.loads(line) for line in (root / "effects.jsonl").read_text().splitlines()]
    for r in rows:  # scored again from the records: the definition of the final loss may have changed
        if (root / r["case"] / "records").is_dir():
            r["final_loss"] = final_loss_of(mean_loss_curve(root / r["case"]))
            r["heals"] = heal_rows(root / r["case"])
    clean = [r for r in rows if r["fault"] == "clean"]
    lines = [f"Clean baseline, seeds {', '.join(str(r['seed']) for r in clean)}: final loss (last {FINAL_STEPS} steps) "
             f"{min(r['final_loss'] for r in clean):.4f}–{max(r['final_loss'] for r in clean):.4f}, held-out "
             f"accuracy {min(r['accuracy_min'] for r in clean):.3f}–{max(r['accuracy_mean'] for r in clean):.3f}.",
             "",
             "| case | on mismatch | first mismatch (step, ranks, what, tensor) | final loss | accuracy (min) "
             "| max loss deviation vs clean s0 | replicas at the end | heal | doctor |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if r["fault"] == "clean":
            continue
        first = r.get("first_mismatch")
        where = (f"{first['step']}, {first['ranks']}, {'+'.join(first['what'])}, {first['tensor'] or '—'}"
                 if first else "—")
        loss = r["final_loss"]
        loss_text = "nan" if loss is None or not math.isfinite(loss) else f"{loss:.4f}"
        dev = r.get("max_rel_loss_deviation")
        dev_text = "nan" if dev is None or loss_text == "nan" else f"{dev:.1%}"
        heals = "; ".join(f"{h['status']} at {h['step']}" + (f" ({h['reason']})" if h.get("reason") else "")
                          for h in r["heals"]) or "—"
        acc = "—" if r["accuracy_min"] is None else f"{r['accuracy_min']:.3f}"
        ends = "parted" if r["parted_at_end"] else "equal"
        lines.append(f"| {r['case']} | {r['on_mismatch']} | {where} | {loss_text} | {acc} | {dev_text} | {ends} "
                     f"| {heals} | {r['doctor']['category']} ({r['doctor']['code']}) |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--world-size", type=int, default=4)
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--out", default="runs/bitflip")
    parser.add_argument("--only", nargs="*", help="only these case names (clean-s0 is needed for deviations)")
    parser.add_argument("--table", action="store_true", help="print the Markdown table of OUT/effects.jsonl and exit")
    args = parser.parse_args()
    root = Path(args.out)
    if args.table:
        print(table(root))
        return
    root.mkdir(parents=True, exist_ok=True)
    clean: dict[int, pl.DataFrame] = {}
    done = {}
    if (root / "effects.jsonl").exists():  # cases measured before are kept, not run again
        done = {row["case"]: row for row in map(json.loads, (root / "effects.jsonl").read_text().splitlines())}
    with open(root / "effects.jsonl", "a") as sink:
        for name, fault, variant, seed, on_mismatch in cases(args.world_size):
            if fault == "clean" and name in done:
                clean[seed] = mean_loss_curve(root / name)
            if name in done or (args.only and name not in args.only):
                continue
            row = measure(name, fault, variant, args.world_size, args.steps, seed, on_mismatch, root, clean)
            if fault == "clean":
                clean[seed] = mean_loss_curve(root / name)
            sink.write(json.dumps(row) + "\n")
            sink.flush()
            loss = row["final_loss"]
            print(f"{name:36} loss {loss if loss is None or not math.isfinite(loss) else round(loss, 4)!s:>8} "
                  f"acc {row['accuracy_mean']} parted_at_end {row['parted_at_end']} "
                  f"first {row.get('first_mismatch')} heals {row['heals']} doctor {row['doctor']['category']}",
                  flush=True)


if __name__ == "__main__":
    main()
