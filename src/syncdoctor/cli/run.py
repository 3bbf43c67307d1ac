"""`syncdoctor run [--out DIR] -- CMD...`: the command line of the launcher
(probe/run/launcher.py), which prepares the run folder and the environment that
attaches the probe in every rank process, runs the command and reaps what it left."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from syncdoctor.errors import InputError
from syncdoctor.probe.run.launcher import run_command
from syncdoctor.settings import DEFAULT_CHECK_EVERY

__all__ = ["register"]


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "run",
        help="run a training command with the probe attached to every rank",
        description="Run CMD (torchrun, python -m torch.distributed.run, msrun, a script that "
        "spawns its ranks, ...) with the probe attached automatically in every rank "
        "process. Records go to DIR/records, each rank's output to DIR/logs. "
        "The exit code is the command's.",
    )
    p.add_argument("--out", metavar="DIR", help="run folder (default: runs/run-YYYYmmdd-HHMMSS)")
    p.add_argument(
        "--check-every",
        type=int,
        metavar="K",
        help=f"cross-rank check every K optimizer steps (default: {DEFAULT_CHECK_EVERY}, torch "
        "and MindSpore alike; 1 = every step)",
    )
    p.add_argument(
        "--on-mismatch",
        choices=("warn", "dump", "raise", "heal"),
        default=None,
        help="on a cross-rank mismatch: log it (warn, default), also write an evidence "
        "bundle (dump), raise SyncMismatchError into training on every rank, or "
        "restore a corrupted replica from the majority (heal; 3+ ranks, docs/hardware.md)",
    )
    p.add_argument(
        "command",
        nargs=argparse.REMAINDER,
        metavar="-- CMD ...",
        help="the launcher command and its arguments, after --",
    )
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise InputError("nothing to run: syncdoctor run [--out DIR] -- CMD ...")
    out = Path(args.out or time.strftime("runs/run-%Y%m%d-%H%M%S"))
    return run_command(command, out, args.check_every, args.on_mismatch)
