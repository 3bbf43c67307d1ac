"""`syncdoctor lab list|run|matrix`: the fault catalog, one fault on N real ranks,
the detection matrix (the work: syncdoctor.lab)."""

from __future__ import annotations

import argparse
import json

from syncdoctor.cli.options import add_check_every, add_json, add_on_mismatch, add_steps, add_world_size, at_least
from syncdoctor.errors import InputError
from syncdoctor.lab.faults import FAULTS, check_fault
from syncdoctor.lab.runner import LAB_CHECK_EVERY, MS_STYLES


def register(sub: argparse._SubParsersAction) -> None:
    lab = sub.add_parser(
        "lab",
        help="reproduce the playbook's failure modes on real process groups",
        description="Reproduce each failure mode for real: N processes in a real process "
        "group over loopback train a small CNN with one named fault injected.",
    )
    lab_sub = lab.add_subparsers(dest="lab_command", metavar="LAB_COMMAND")
    lab.set_defaults(func=lambda args: lab.print_help() or 2)

    ls = lab_sub.add_parser(
        "list",
        help="list the fault catalog",
        description="The fault catalog: each fault's name (what `lab run` takes), its "
        "variants, the root-cause category and what it was measured to do.",
    )
    add_json(ls, "print the catalog as JSON")
    ls.set_defaults(func=cmd_list)

    run = lab_sub.add_parser(
        "run",
        help="run one fault (or 'clean') on N ranks",
        description="Run one fault (or the clean baseline) on N real ranks with the probe "
        "attached; logs and records go to the run folder.",
    )
    run.add_argument("fault", help="a fault name from `syncdoctor lab list`")
    run.add_argument("--variant", default="", help="the fault's variant, when it has several")
    _common(run)
    run.add_argument("--seed", type=int, default=0, help="the run's seed (every rank alike)")
    run.add_argument("--out", help="run folder (default runs/FAULT-wN-sSEED)")
    run.add_argument("--no-probe", action="store_true", help="run without the probe (logs only)")
    add_check_every(run, default=LAB_CHECK_EVERY)
    add_on_mismatch(run, "the probe's action on a mismatch")
    run.set_defaults(func=cmd_run)

    matrix = lab_sub.add_parser(
        "matrix",
        help="every fault through lab, probe and doctor: the detection matrix",
        description="Run the clean baseline (three seeds) and every fault and variant "
        "through the probe and the doctor; exit 1 when any is misdiagnosed.",
    )
    _common(matrix)
    add_json(matrix, "print the rows as JSON")
    matrix.add_argument("--markdown", action="store_true", help="print the table as Markdown (for the README)")
    matrix.add_argument("--out", default="runs/matrix", help="folder for the runs")
    matrix.add_argument("--only", nargs="*", metavar="FAULT", help="only these faults")
    matrix.set_defaults(func=cmd_matrix)


def _common(p: argparse.ArgumentParser) -> None:
    add_world_size(p, "ranks (processes)", metavar="N")
    add_steps(p, "optimizer steps (rounded up to whole epochs)", default=150)
    p.add_argument("--onset", type=at_least(0), default=40, help="the step at which step-triggered faults act")
    p.add_argument("--framework", choices=("torch", "mindspore"), default="torch", help="the training framework")
    p.add_argument(
        "--pg-timeout", type=at_least(0.1, float), default=20.0, metavar="S", help="process-group timeout in seconds"
    )
    p.add_argument(
        "--style", choices=MS_STYLES, default=None, help="MindSpore: how the step is written (default functional)"
    )


def cmd_list(args: argparse.Namespace) -> int:
    rows = [
        {
            "name": f.name,
            "description": f.description,
            "symptom": f.symptom,
            "category": f.category,
            "measured": f.measured,
            "variants": [v for v in f.variants if v],
            "frameworks": list(f.frameworks),
            "ends_in_error": f.ends_in_error,
            "mindspore_variants": [v for v in f.variants_for("mindspore") if v],
            "mindspore_styles_not_on": dict(f.ms_styles_not_on),
        }
        for f in FAULTS.values()
    ]
    if args.json:
        print(json.dumps(rows, indent=1, ensure_ascii=False))
        return 0
    print(format_catalog(rows))
    return 0


def format_catalog(rows: list[dict], width: int | None = None) -> str:
    """One block per fault, its name first and whole (it is what `lab run` takes),
    the rest wrapped to the terminal: readable at 80 columns."""
    import shutil
    import textwrap

    width = max(40, min(width or shutil.get_terminal_size((80, 24)).columns, 100))
    out = ["syncdoctor lab faults (run one with: syncdoctor lab run NAME [--variant V])", ""]
    for r in rows:
        out.append(f"{r['name']}  ({r['category']}; {', '.join(r['frameworks'])})")
        if r["variants"]:
            out.append(f"    variants: {', '.join(r['variants'])}")
        for label, text in (("", r["description"]), ("measured: ", r["measured"])):
            out += textwrap.wrap(
                label + text, width, initial_indent="    ", subsequent_indent="    ", break_on_hyphens=False
            )
        out.append("")
    return "\n".join(out).rstrip() + "\n"


def cmd_run(args: argparse.Namespace) -> int:
    from syncdoctor.lab.runner import run_lab

    check_fault(args.fault, args.variant)
    try:
        result = run_lab(
            args.fault,
            variant=args.variant,
            world_size=args.world_size,
            steps=args.steps,
            onset=args.onset,
            seed=args.seed,
            out=args.out,
            framework=args.framework,
            probe=not args.no_probe,
            check_every=args.check_every,
            pg_timeout_s=args.pg_timeout,
            on_mismatch=args.on_mismatch,
            style=args.style,
        )
    except ValueError as exc:
        raise InputError(str(exc)) from exc
    fault = FAULTS[args.fault]
    acc = ", ".join(f"rank {r}: {a:.3f}" for r, a in sorted(result.accuracy.items())) or "none (no rank finished)"
    print(
        f"lab run {args.fault}{' ' + result.variant if result.variant else ''}: world size {args.world_size}, "
        f"{result.duration_s:.1f}s, exit codes {result.exit_codes}{' (timed out)' if result.timed_out else ''}"
    )
    print(f"held-out accuracy: {acc}")
    print(f"logs and records: {result.out}  →  syncdoctor diagnose {result.out}")
    if not result.ok and not fault.ends_in_error:
        return 1
    return 0


def cmd_matrix(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from syncdoctor.lab.matrix import MatrixRow, run_matrix

    console = Console(stderr=args.json)

    def progress(row: MatrixRow) -> None:
        mark = "ok" if row.correct else "WRONG"
        console.print(
            f"{row.fault:26} {row.variant:13} seed {row.seed}: {row.top_category:26} {mark} ({row.duration_s}s)",
            markup=False,
        )

    if args.style and args.framework != "mindspore":
        raise InputError("--style applies to --framework mindspore only")
    if args.only:
        for name in args.only:
            check_fault(name)
    rows = run_matrix(
        args.out,
        world_size=args.world_size,
        framework=args.framework,
        steps=args.steps,
        onset=args.onset,
        pg_timeout_s=min(args.pg_timeout, 10.0),
        only=args.only,
        progress=progress,
        style=args.style,
    )
    if args.json:
        print(json.dumps([r.to_json() for r in rows], indent=1))
    elif args.markdown:
        print("| fault | variant | seed | top category | correct | onset | detected at | run |")
        print("|---|---|---|---|---|---|---|---|")
        for r in rows:
            step = "—" if r.detection_step is None else str(r.detection_step)
            print(
                f"| {r.fault} | {r.variant or '—'} | {r.seed} | {r.top_category} ({r.top_code or '—'}) | "
                f"{'✓' if r.correct else '✗'} | {r.onset_step or '—'} | {step} | {r.duration_s:.0f} s |"
            )
        print(f"\n{sum(r.correct for r in rows)}/{len(rows)} correct")
    else:
        style = f", {args.style} style" if args.style else ""
        table = Table(title=f"detection matrix ({args.framework}{style}, world size {args.world_size})")
        for col in ("fault", "variant", "seed", "detected", "top category", "correct", "onset", "detected at"):
            table.add_column(col)
        for r in rows:
            detected = "—" if r.expected == "healthy" else ("yes" if r.top_category != "healthy" else "no")
            table.add_row(
                r.fault,
                r.variant,
                str(r.seed),
                detected,
                r.top_category,
                "✓" if r.correct else "✗",
                str(r.onset_step or "—"),
                str(r.detection_step if r.detection_step is not None else "—"),
            )
        console.print(table)
        correct = sum(r.correct for r in rows)
        console.print(f"{correct}/{len(rows)} correct")
        for fault in FAULTS.values():
            if args.framework not in fault.frameworks:
                console.print(
                    f"not on {args.framework}: {fault.name} — {fault.not_on.get(args.framework, '')}", markup=False
                )
            elif args.style in fault.ms_styles_not_on:
                console.print(
                    f"not in the {args.style} style: {fault.name} — {fault.ms_styles_not_on[args.style]}", markup=False
                )
    return 0 if all(r.correct for r in rows) else 1
