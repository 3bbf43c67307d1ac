"""`syncdoctor diagnose PATH...`: probe run folders and/or raw logs, diagnosed (the
work: syncdoctor.doctor); several run folders each on its own, then across runs."""

from __future__ import annotations

import argparse
import contextlib
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

from syncdoctor.cli.options import add_html, add_json, write_output
from syncdoctor.errors import InputError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "diagnose",
        help="diagnose a probe run folder and/or raw logs",
        description="Read probe records and/or raw logs (per-rank training logs, NCCL, "
        "HCCL/Ascend, MindSpore, torchrun) and rank the likely root causes.",
    )
    p.add_argument(
        "paths",
        nargs="+",
        metavar="PATH",
        help="a probe run folder, log files, or folders of logs ('-' reads a pasted log from "
        "standard input); several run folders are diagnosed each on its own, then across runs "
        "(a host that recurs)",
    )
    p.add_argument(
        "--baseline",
        metavar="BASELINE_RUN",
        action="append",
        help="a single-card (or earlier healthy) run of the same recipe: a probe run folder or logs, "
        "as PATH takes them (repeat for several log files); says where the loss curves part and "
        "whether the difference is the parallel part",
    )
    add_json(p, "print the diagnosis as JSON on stdout")
    add_html(p, "also write a self-contained HTML report (several run folders: FILE.1.html, FILE.2.html, …)")
    p.set_defaults(func=cmd_diagnose)


def cmd_diagnose(args: argparse.Namespace) -> int:
    from syncdoctor.cli.allocator import keep_freed_memory
    from syncdoctor.doctor.diagnose import diagnose
    from syncdoctor.doctor.report import render_html, render_json, render_terminal
    from syncdoctor.records.reader import is_run_dir

    keep_freed_memory()  # this process's own allocator (cli/allocator.py)
    run_dirs = [p for p in args.paths if p != "-" and Path(p).is_dir() and is_run_dir(Path(p))]
    if len(run_dirs) > 1:
        return _diagnose_runs(args, run_dirs, [p for p in args.paths if p not in run_dirs])
    with _stdin_as_file(args.paths) as paths:
        diag = diagnose(paths, baseline=args.baseline)
    if args.html:
        write_output(Path(args.html), render_html(diag))
    if args.json:
        print(render_json(diag))
    else:
        render_terminal(diag)
    if args.html:
        print(f"HTML report: {Path(args.html).resolve()}", file=sys.stderr if args.json else sys.stdout)
    return diag.exit_code


def _diagnose_runs(args: argparse.Namespace, run_dirs: list[str], loose: list[str]) -> int:
    """Several run folders: each diagnosed on its own (loose log paths together, as one
    more), then what they share: a host that recurs in hardware.corruption findings."""
    from syncdoctor.doctor import across_runs
    from syncdoctor.doctor.report import render_html

    runs = across_runs.diagnose_runs([[d] for d in run_dirs] + ([loose] if loose else []), baseline=args.baseline)
    if args.html:
        base = Path(args.html)
        for i, run in enumerate(runs, 1):
            path = base.with_name(f"{base.stem}.{i}{base.suffix or '.html'}")
            write_output(path, render_html(run.diagnosis, title=f"syncdoctor report: {run.path}"))
            print(f"HTML report {i}: {path.resolve()}", file=sys.stderr if args.json else sys.stdout)
    if args.json:
        print(across_runs.render_json(runs))
    else:
        across_runs.render_terminal(runs)
    return max(run.diagnosis.exit_code for run in runs)


@contextlib.contextmanager
def _stdin_as_file(paths: list[str]) -> Iterator[list[str]]:
    """'-' among the paths: standard input (a pasted log) copied to a temporary
    file named stdin.log, removed afterwards."""
    if "-" not in paths:
        yield paths
        return
    if sys.stdin is None or sys.stdin.isatty():
        raise InputError("diagnose -: paste a log on standard input (or pipe one in), then end it with Ctrl-D")
    with tempfile.TemporaryDirectory(prefix="syncdoctor-stdin-") as tmp:
        target = Path(tmp) / "stdin.log"
        with open(target, "wb") as out:
            shutil.copyfileobj(sys.stdin.buffer, out, 1 << 20)
        if target.stat().st_size == 0:
            raise InputError("diagnose -: standard input was empty")
        yield [str(target) if p == "-" else p for p in paths]
