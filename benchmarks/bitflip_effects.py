"""The bit-flip variants' measured effects, with and without heal, against the clean
baseline's seed-to-seed spread (the table in docs/hardware.md and the lab catalog).

    python benchmarks/bitflip_effects.py [--world-size 4] [--steps 150] [--out runs/bitflip] [--only NAME ...]
    python benchmarks/bitflip_effects.py --out runs/bitflip --table     # the effect table
    python benchmarks/bitflip_effects.py --out runs/bitflip --spread    # heal vs the clean seed-to-seed spread

The heal must-show (a one-time flip in a parameter on rank 2 of 4, healed, ends
within the clean baseline's seed-to-seed spread; every replica bitwise equal at every
later check) needs only `--only clean-s0 clean-s1 clean-s2 bit-flip-param-heal
bit-flip-param-heal-s1 bit-flip-param-heal-s2`, then `--spread`.

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

ONSET = 40  # the flip lands just before the update of a check step: the check sees it at once
MID_ONSET = 31  # the flip lands right after a check (30): the corrupted copy trains 9 steps until the next one
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
            rows.append(
                {
                    "step": e["step"],
                    **{k: e["heal"].get(k) for k in ("status", "odd", "source", "bytes", "seconds", "reason")},
                }
            )
    return rows


STATE = ("param_fp", "opt_fp", "grad_fp", "buffer_fp")  # what a replica holds, fingerprinted at checks


def equal_after(out: Path, step: int) -> bool:
    """Whether at every check after `step` every rank recorded the same parameters,
    optimizer state, reduced gradients and buffers (where measured), and the live
    check agreed."""
    records = read_run(out)
    measured = records.steps.filter(pl.col("param_fp").is_not_null() & (pl.col("step") > step))
    if not measured.height:
        return False
    per_step = measured.group_by("step").agg(
        pl.len().alias("ranks"), *(pl.col(c).drop_nulls().n_unique().alias(c) for c in STATE)
    )
    ranks = measured["rank"].n_unique()
    return bool(
        (per_step["ranks"] == ranks).all()
        and all((per_step[c] <= 1).all() for c in STATE)
        and all(c["status"] == "ok" for c in records.checks if c["step"] > step)
    )


def same_as_clean_from(out: Path, clean: Path) -> int | None:
    """The first check step from which the run's parameters are bitwise those of the
    clean run of the same seed at every later check (None: never)."""

    def fps(run: Path) -> dict[int, set[int]]:
        frame = read_run(run).steps.filter(pl.col("param_fp").is_not_null())
        return {s: set(g["param_fp"].to_list()) for (s,), g in frame.group_by("step")}

    mine, theirs = fps(out), fps(clean)
    since = None
    for step in sorted(mine):
        same = mine[step] == theirs.get(step)
        since = (since or step) if same else None
    return since


def measure(
    name: str,
    fault: str,
    variant: str,
    world_size: int,
    steps: int,
    seed: int,
    on_mismatch: str | None,
    root: Path,
    clean: dict[int, pl.DataFrame],
    onset: int = ONSET,
) -> dict[str, Any]:
    out = root / name
    result = run_lab(
        fault,
        variant=variant,
        world_size=world_size,
        steps=steps,
        onset=onset,
        seed=seed,
        out=out,
        check_every=CHECK_EVERY,
        on_mismatch=on_mismatch,
        pg_timeout_s=20.0,
    )
    records = read_run(out)
    steps_frame = records.steps
    curve = mean_loss_curve(out)
    final_loss = final_loss_of(curve)
    row: dict[str, Any] = {
        "case": name,
        "fault": fault,
        "variant": variant,
        "world_size": world_size,
        "seed": seed,
        "onset": onset,
        "on_mismatch": on_mismatch or "warn",
        "ok": result.ok,
        "duration_s": round(result.duration_s, 1),
        "final_loss": final_loss,
        "nonfinite_loss_steps": int(steps_frame["loss"].null_count()),
        "accuracy_mean": (sum(result.accuracy.values()) / len(result.accuracy) if result.accuracy else None),
        "accuracy_min": min(result.accuracy.values()) if result.accuracy else None,
    }
    if seed in clean and fault != "clean":
        joined = curve.join(clean[seed], on="step", suffix="_clean").filter(pl.col("step") >= onset)
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
        row["equal_at_every_check_after_heal"] = equal_after(out, max(healed))
    diag = diagnose([out])
    top = diag.findings[0] if diag.findings else None
    row["doctor"] = {
        "category": top.category if top else "healthy",
        "code": top.code if top else "",
        "ranks": top.ranks if top else [],
        "step": top.step if top else None,
        "tensor": top.tensor if top else None,
        "title": top.title if top else "",
    }
    return row


def cases(world_size: int) -> list[tuple[str, str, str, int, str | None]]:
    out: list[tuple[str, str, str, int, str | None]] = [(f"clean-s{s}", "clean", "", s, None) for s in (0, 1, 2)]
    for variant in FAULTS["bit-flip"].variants:
        out.append((f"bit-flip-{variant}", "bit-flip", variant, 0, None))
        out.append((f"bit-flip-{variant}-heal", "bit-flip", variant, 0, "heal"))
    out += [(f"bit-flip-param-heal-s{s}", "bit-flip", "param", s, "heal") for s in (1, 2)]
    out += [(f"bit-flip-param-s{s}", "bit-flip", "param", s, None) for s in (1, 2)]
    out += [(f"bit-flip-param-mid-heal-s{s}", "bit-flip", "param", s, "heal") for s in (0, 1, 2)]
    out += [(f"bit-flip-param-mid-s{s}", "bit-flip", "param", s, None) for s in (0, 1, 2)]
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
    lines = [
        f"Clean baseline, seeds {', '.join(str(r['seed']) for r in clean)}: final loss (last {FINAL_STEPS} steps) "
        f"{min(r['final_loss'] for r in clean):.4f}–{max(r['final_loss'] for r in clean):.4f}, held-out "
        f"accuracy {min(r['accuracy_min'] for r in clean):.3f}–{max(r['accuracy_mean'] for r in clean):.3f}.",
        "",
        "| case | on mismatch | first mismatch (step, ranks, what, tensor) | final loss | accuracy (min) "
        "| max loss deviation vs the clean run of its seed | replicas at the end | heal | doctor |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if r["fault"] == "clean":
            continue
        first = r.get("first_mismatch")
        where = (
            f"{first['step']}, {first['ranks']}, {'+'.join(first['what'])}, {first['tensor'] or '—'}" if first else "—"
        )
        loss = r["final_loss"]
        loss_text = "nan" if loss is None or not math.isfinite(loss) else f"{loss:.4f}"
        dev = r.get("max_rel_loss_deviation")
        dev_text = "nan" if dev is None or loss_text == "nan" else f"{dev:.1%}"
        heals = (
            "; ".join(
                f"{h['status']} at {h['step']}" + (f" ({h['reason']})" if h.get("reason") else "") for h in r["heals"]
            )
            or "—"
        )
        acc = "—" if r["accuracy_min"] is None else f"{r['accuracy_min']:.3f}"
        ends = "parted" if r["parted_at_end"] else "equal"
        lines.append(
            f"| {r['case']} | {r['on_mismatch']} | {where} | {loss_text} | {acc} | {dev_text} | {ends} "
            f"| {heals} | {r['doctor']['category']} ({r['doctor']['code']}) |"
        )
    return "\n".join(lines)


def spread(root: Path) -> str:
    """The heal must-show from OUT/effects.jsonl: each seed's healed one-time parameter
    flip (rank 2 of 4) against the clean baseline's seed-to-seed spread."""
    rows = {r["case"]: r for r in map(json.loads, (root / "effects.jsonl").read_text().splitlines())}
    clean = {s: rows.get(f"clean-s{s}") for s in (0, 1, 2)}
    if any(r is None for r in clean.values()):
        return "not measured yet: the clean runs of seeds 0-2"
    for r in clean.values():
        r["final_loss"] = final_loss_of(mean_loss_curve(root / r["case"]))
    losses = [r["final_loss"] for r in clean.values()]
    accs = [r["accuracy_mean"] for r in clean.values()]
    lines = [
        f"Clean baseline (4 ranks, seeds 0-2): final loss (mean over ranks, last {FINAL_STEPS} steps) "
        f"{min(losses):.4f}–{max(losses):.4f}, held-out accuracy {min(accs):.4f}–{max(accs):.4f}."
    ]
    verdicts = []

    def plain(name: str | None) -> str:
        row = rows.get(name or "")
        if row is None:
            return "—"
        loss = final_loss_of(mean_loss_curve(root / row["case"]))
        return f"{loss:.4f}, {row['accuracy_mean']:.4f}" if loss is not None and math.isfinite(loss) else "nan"

    for title, names, unhealed in (
        (
            f"Flip at step {ONSET} (just before a check's update)",
            ["bit-flip-param-heal", "bit-flip-param-heal-s1", "bit-flip-param-heal-s2"],
            ["bit-flip-param", "bit-flip-param-s1", "bit-flip-param-s2"],
        ),
        (
            f"Flip at step {MID_ONSET} (right after a check: {CHECK_EVERY - 1} steps until the next)",
            [f"bit-flip-param-mid-heal-s{s}" for s in (0, 1, 2)],
            [f"bit-flip-param-mid-s{s}" for s in (0, 1, 2)],
        ),
    ):
        healed = {s: rows.get(name) for s, name in enumerate(names)}
        if any(r is None for r in healed.values()):
            lines += ["", f"{title}: not measured yet"]
            continue
        lines += [
            "",
            title + ":",
            "",
            "| seed | clean loss | clean accuracy | healed loss | healed accuracy | flip seen (step, ranks, "
            "tensor) | healed at | every replica equal at every later check | bitwise the clean run's from "
            "| inside the clean spread | no heal: loss, accuracy |",
            "|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        holds = True
        for s in (0, 1, 2):
            c, h = clean[s], healed[s]
            h["final_loss"] = final_loss_of(mean_loss_curve(root / h["case"]))
            first = h.get("first_mismatch") or {}
            steps = [x["step"] for x in heal_rows(root / h["case"]) if x["status"] == "healed"]
            equal = equal_after(root / h["case"], max(steps)) if steps else False
            since = same_as_clean_from(root / h["case"], root / c["case"])
            inside = (
                h["final_loss"] is not None
                and min(losses) <= h["final_loss"] <= max(losses)
                and min(accs) <= h["accuracy_mean"] <= max(accs)
            )
            holds &= inside and equal
            lines.append(
                f"| {s} | {c['final_loss']:.4f} | {c['accuracy_mean']:.4f} | {h['final_loss']:.4f} | "
                f"{h['accuracy_mean']:.4f} | {first.get('step')}, {first.get('ranks')}, "
                f"{first.get('tensor')} | {', '.join(map(str, steps)) or '—'} | {'yes' if equal else 'NO'} | "
                f"{'step ' + str(since) if since is not None else 'never'} | {'yes' if inside else 'NO'} | "
                f"{plain(unhealed[s] if s < len(unhealed) else None)} |"
            )
        verdicts.append(
            f"{title}: {'inside the clean spread, replicas equal after the heal' if holds else 'NOT inside'}"
        )
    return "\n".join([*lines, "", *verdicts])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--world-size", type=int, default=4)
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--out", default="runs/bitflip")
    parser.add_argument("--only", nargs="*", help="only these case names (clean-s0 is needed for deviations)")
    parser.add_argument("--table", action="store_true", help="print the Markdown table of OUT/effects.jsonl and exit")
    parser.add_argument(
        "--spread", action="store_true", help="print the healed runs against the clean seed-to-seed spread and exit"
    )
    args = parser.parse_args()
    root = Path(args.out)
    if args.table:
        print(table(root))
        return
    if args.spread:
        print(spread(root))
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
            row = measure(
                name,
                fault,
                variant,
                args.world_size,
                args.steps,
                seed,
                on_mismatch,
                root,
                clean,
                MID_ONSET if "-mid-" in name else ONSET,
            )
            if fault == "clean":
                clean[seed] = mean_loss_curve(root / name)
            sink.write(json.dumps(row) + "\n")
            sink.flush()
            loss = row["final_loss"]
            print(
                f"{name:36} loss {loss if loss is None or not math.isfinite(loss) else round(loss, 4)!s:>8} "
                f"acc {row['accuracy_mean']} parted_at_end {row['parted_at_end']} "
                f"first {row.get('first_mismatch')} heals {row['heals']} doctor {row['doctor']['category']}",
                flush=True,
            )


if __name__ == "__main__":
    main()
