"""`syncdoctor experiment [--steps N] [--variants a,b] -- <launcher command>`: rerun the
user's own job for N steps as it is (the control), then once per variant, each in its
own run folder, and say which variant makes the anomaly disappear (the work:
syncdoctor.experiment.runner)."""

from __future__ import annotations

import argparse
import contextlib
import json
import signal
import sys
from pathlib import Path
from typing import Any

from syncdoctor.cli.options import (
    add_check_every,
    add_command,
    add_html,
    add_json,
    add_steps,
    at_least,
    command_after_dashes,
    did_you_mean,
    out_or_timestamped,
    write_output,
)
from syncdoctor.errors import InputError
from syncdoctor.experiment.runner import DEFAULT_CHECK_EVERY, DEFAULT_STEPS, DEFAULT_TIMEOUT_S
from syncdoctor.settings import VARIANTS


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "experiment",
        help="rerun a job under controlled variants and name the one that removes the anomaly",
        description="Rerun CMD (torchrun, msrun, accelerate launch, ...) for N steps as it is "
        "(the control), then once per variant: " + ", ".join(VARIANTS) + ". Each run gets "
        "its own folder OUT/NAME that `syncdoctor diagnose` reads; the table says which variant "
        "removes the replica mismatch, the per-rank loss offsets, the sawtooth or the blow-up.",
    )
    p.add_argument("--out", metavar="DIR", help="experiment folder (default: runs/experiment-YYYYmmdd-HHMMSS)")
    add_steps(p, "stop every run after N optimizer steps", default=DEFAULT_STEPS, metavar="N")
    p.add_argument(
        "--variants",
        metavar="A,B",
        default=",".join(VARIANTS),
        help="the variants to run after the control, comma-separated",
    )
    add_check_every(p, default=DEFAULT_CHECK_EVERY)
    p.add_argument(
        "--timeout",
        type=at_least(1.0, float),
        default=DEFAULT_TIMEOUT_S,
        metavar="S",
        help="end a run that is still going after S seconds",
    )
    add_json(p, "print the result as JSON on stdout")
    add_html(p, "also write the experiment as an HTML report")
    add_command(p, "the launcher command and its arguments")
    p.set_defaults(func=cmd_experiment)


def parse_variants(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    for n in names:
        if n not in VARIANTS:
            raise InputError(f"unknown variant {n!r}{did_you_mean(n, VARIANTS)}; the variants: {', '.join(VARIANTS)}")
    return list(dict.fromkeys(names))


def _raise_on_term(signum: int, _frame: Any) -> None:
    raise KeyboardInterrupt  # the runs in flight are ended on the way out (experiment/launch.run_variant)


def cmd_experiment(args: argparse.Namespace) -> int:
    from rich.console import Console

    from syncdoctor.experiment.report import print_table, render_page
    from syncdoctor.experiment.runner import run_experiment

    command = command_after_dashes(args, "syncdoctor experiment [--steps N] -- CMD ...")
    variants = parse_variants(args.variants)
    out = out_or_timestamped(args.out, "experiment")
    for name in ["control", *variants]:
        records = out / name / "records"
        if records.is_dir() and any(records.glob("rank*.jsonl")):
            raise InputError(f"{out / name} already holds a run's records; choose another --out or remove it")
    console = Console(stderr=True)
    previous = {s: signal.signal(s, _raise_on_term) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        result = run_experiment(
            command,
            out,
            variants=variants,
            steps=args.steps,
            check_every=args.check_every,
            timeout_s=args.timeout,
            progress=lambda text: console.print(f"syncdoctor experiment: {text}", markup=False, highlight=False),
        )
    finally:
        for s, handler in previous.items():
            with contextlib.suppress(Exception):
                signal.signal(s, handler)
    comparison = result.pop("_comparison")
    if args.html:
        write_output(Path(args.html), render_page(comparison, command))
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        print_table(comparison, Console())
        print(f"run folders in {result['out']} (syncdoctor diagnose {result['out']}/NAME)", file=sys.stderr)
    return 0
