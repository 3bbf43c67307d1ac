"""`syncdoctor demo`: the clean baseline and the playbook's headline failure, each a
real lab run, each diagnosed, with an HTML report."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from syncdoctor.cli.options import add_world_size, write_output


def register(sub: argparse._SubParsersAction) -> None:
    demo = sub.add_parser(
        "demo",
        help="the clean baseline and the playbook's headline failure, diagnosed",
        description="Two real data-parallel runs over gloo on loopback (the clean baseline, "
        "then a rank silently left out of the gradient average after a "
        "communication retry), each diagnosed, with an HTML report.",
    )
    demo.add_argument("--out", default="runs/demo", help="folder for the runs and the reports")
    add_world_size(demo, "ranks per run")
    demo.set_defaults(func=cmd_demo)


def cmd_demo(args: argparse.Namespace) -> int:
    from syncdoctor.doctor.diagnose import diagnose
    from syncdoctor.doctor.report import render_html, render_terminal
    from syncdoctor.lab.runner import run_lab

    out = Path(args.out)
    print("syncdoctor demo: two real data-parallel runs over gloo on loopback, then the doctor.\n")
    worst = 0
    for fault, title in (
        ("clean", "1/2 the clean baseline"),
        (
            "dropped-rank",
            "2/2 the playbook's headline failure: after a comm timeout and "
            "retry, one rank is silently left out of the gradient average",
        ),
    ):
        print(f"── {title}", flush=True)
        result = run_lab(fault, world_size=args.world_size, out=out / fault)
        print(
            f"   {result.duration_s:.1f}s, exit codes {result.exit_codes}, held-out accuracy "
            + ", ".join(f"rank {r}: {a:.3f}" for r, a in sorted(result.accuracy.items())),
            flush=True,
        )
        diag = diagnose([result.out])
        render_terminal(diag)
        html = out / f"{fault}.html"
        write_output(html, render_html(diag))
        print(f"HTML report: {html.resolve()}\n", flush=True)
        worst = max(worst, 0 if (fault == "clean") == (diag.verdict == "healthy") else 1)
    sys.stdout.flush()
    return worst
