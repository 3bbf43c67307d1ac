"""`syncdoctor experiment [--steps N] [--variants a,b] -- <launcher command>`: rerun the
user's own job for N steps as it is (the control), then once per variant, each in its
own run folder, and say which variant makes the anomaly disappear."""

from __future__ import annotations

import argparse
import contextlib
import json
import signal
import sys
import time
from pathlib import Path
from typing import Any

from syncdoctor.cli import at_least, did_you_mean
from syncdoctor.errors import InputError
from syncdoctor.experiment import inrank
from syncdoctor.settings import VARIANT_LR_ENV, VARIANT_WORLD_ENV, VARIANTS

SCHEMA = "syncdoctor.experiment/1"
DEFAULT_STEPS = 200
DEFAULT_CHECK_EVERY = 10  # reruns are short: a check every 10 steps gives the doctor enough
DEFAULT_TIMEOUT_S = 900.0


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
    p.add_argument(
        "--steps",
        type=at_least(1),
        default=DEFAULT_STEPS,
        metavar="N",
        help="stop every run after N optimizer steps",
    )
    p.add_argument(
        "--variants",
        metavar="A,B",
        default=",".join(VARIANTS),
        help="the variants to run after the control, comma-separated",
    )
    p.add_argument(
        "--check-every",
        type=at_least(1),
        default=DEFAULT_CHECK_EVERY,
        metavar="K",
        help="the probe's cross-rank check every K steps",
    )
    p.add_argument(
        "--timeout",
        type=at_least(1.0, float),
        default=DEFAULT_TIMEOUT_S,
        metavar="S",
        help="end a run that is still going after S seconds",
    )
    p.add_argument("--json", action="store_true", help="print the result as JSON on stdout")
    p.add_argument("--html", metavar="FILE", help="also write the experiment as an HTML report")
    p.add_argument(
        "command", nargs=argparse.REMAINDER, metavar="-- CMD ...", help="the launcher command and its arguments"
    )
    p.set_defaults(func=cmd_experiment)


def parse_variants(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    for n in names:
        if n not in VARIANTS:
            raise InputError(f"unknown variant {n!r}{did_you_mean(n, VARIANTS)}; the variants: {', '.join(VARIANTS)}")
    return list(dict.fromkeys(names))


def _raise_on_term(signum: int, _frame: Any) -> None:
    raise KeyboardInterrupt  # the runs in flight are ended on the way out (launch.run_variant)


def run_experiment(
    command: list[str],
    out: Path,
    *,
    variants: list[str],
    steps: int | None,
    check_every: int | None = DEFAULT_CHECK_EVERY,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    progress: Any = None,
) -> dict[str, Any]:
    """Run the control and each variant; returns the JSON result (also OUT/experiment.json)."""
    from syncdoctor.experiment.compare import Measures, compare, measure
    from syncdoctor.experiment.launch import run_variant
    from syncdoctor.experiment.single import single_rank, with_lab_out

    say = progress or (lambda _text: None)
    out = out.resolve()
    out.mkdir(parents=True, exist_ok=True)

    def one(name: str, cmd: list[str], env: dict[str, str]) -> Measures:
        folder = out / name
        say(f"{name}: {' '.join(cmd)}")
        result = run_variant(
            with_lab_out(cmd, str(folder)),
            folder,
            env_extra=env,
            steps=steps,
            check_every=check_every,
            timeout_s=timeout_s,
        )
        m = measure(name, folder)
        m.returncode, m.timed_out = result.returncode, result.timed_out
        if result.returncode in (126, 127) and m.steps is None:
            m.error = f"the command could not start (exit {result.returncode}; see {folder}/.syncdoctor/launcher.log)"
        if result.timed_out and not m.error:
            m.error = f"timed out after {timeout_s:g} s" if m.steps is None else ""
        say(f"{name}: done in {result.seconds:.0f} s, exit {result.returncode}, {m.steps or 0} steps recorded")
        return m

    control = one("control", command, {})
    runs: list[Measures] = []
    single = single_rank(command)
    world = control.world_size or single.world_size
    for name in variants:
        env = inrank.environment(name)
        if world:
            env[VARIANT_WORLD_ENV] = str(world)
        if name == "single":
            if control.first_lr:
                env[VARIANT_LR_ENV] = repr(control.first_lr)
            if single.command is None:
                m = Measures(name, str(out / name), ran=False, how=single.why)
                runs.append(m)
                say(f"single: not applied: {single.why}")
                continue
            m = one(name, single.command, env)
            if m.applied is None:
                m.how = "; ".join(single.changes)
            runs.append(m)
        else:
            runs.append(one(name, command, env))
    comparison = compare(control, runs)
    result = {
        "schema": SCHEMA,
        "command": command,
        "steps": steps,
        "out": str(out),
        "single_rank_command": single.command,
        **comparison.to_json(),
    }
    (out / "experiment.json").write_text(json.dumps(result, indent=1))
    result["_comparison"] = comparison
    return result


def cmd_experiment(args: argparse.Namespace) -> int:
    from rich.console import Console

    from syncdoctor.experiment.report import print_table, render_page

    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise InputError("nothing to run: syncdoctor experiment [--steps N] -- CMD ...")
    variants = parse_variants(args.variants)
    out = Path(args.out or time.strftime("runs/experiment-%Y%m%d-%H%M%S"))
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
        Path(args.html).write_text(render_page(comparison, command))
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        print_table(comparison, Console())
        print(f"run folders in {result['out']} (syncdoctor diagnose {result['out']}/NAME)", file=sys.stderr)
    return 0
