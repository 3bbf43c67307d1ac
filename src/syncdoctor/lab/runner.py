"""Run one lab experiment: N ranks, one fault, one folder of logs and records."""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from syncdoctor.lab import forkserver
from syncdoctor.lab.faults import FAULTS, plans_for
from syncdoctor.lab.launch import free_port, run_ranks
from syncdoctor.settings import RUN_DIR_ENV

# Set to 1, the ranks are spawned as fresh interpreters even where they could be forked.
SPAWN_ENV = "SYNCDOCTOR_LAB_SPAWN"

STARTUP_BUDGET_S = 60.0  # interpreter, torch import and process-group rendezvous


@dataclass
class LabResult:
    fault: str
    variant: str
    framework: str
    world_size: int
    out: Path
    exit_codes: list[int | None]
    timed_out: bool
    duration_s: float
    accuracy: dict[int, float] = field(default_factory=dict)
    steps_done: dict[int, int] = field(default_factory=dict)
    started: str = "spawned"  # how the ranks were started: "spawned", or "forked" by the fork server

    @property
    def ok(self) -> bool:
        return not self.timed_out and all(code == 0 for code in self.exit_codes)

    def to_json(self) -> dict[str, Any]:
        fault = FAULTS[self.fault]
        return {
            "fault": self.fault,
            "variant": self.variant,
            "framework": self.framework,
            "world_size": self.world_size,
            "category": fault.category,
            "ends_in_error": fault.ends_in_error,
            "exit_codes": self.exit_codes,
            "timed_out": self.timed_out,
            "duration_s": round(self.duration_s, 2),
            "accuracy": {str(k): v for k, v in self.accuracy.items()},
            "steps_done": {str(k): v for k, v in self.steps_done.items()},
            "started": self.started,
        }


# How a MindSpore lab rank writes its training step (lab/train_mindspore.py).
MS_STYLES = ("functional", "cell", "model")

# Lab runs are short (150 steps): a check every 10 steps gives the detector 16 checks
# to work with, where the probe's production default (cheaper) would give 8.
LAB_CHECK_EVERY = 10


def run_lab(
    fault: str,
    *,
    variant: str = "",
    world_size: int = 2,
    steps: int = 150,
    onset: int = 40,
    seed: int = 0,
    out: str | Path | None = None,
    framework: str = "torch",
    probe: bool = True,
    check_every: int = LAB_CHECK_EVERY,
    pg_timeout_s: float = 20.0,
    on_mismatch: str | None = None,
    style: str | None = None,
) -> LabResult:
    """style: MindSpore only, how the training step is written (MS_STYLES)."""
    if fault not in FAULTS:
        raise KeyError(fault)
    spec = FAULTS[fault]
    variants = spec.variants_for(framework)
    variant = variant or variants[0]
    if variant not in variants:
        raise ValueError(f"fault {fault} has variants {', '.join(variants)}, not {variant!r}")
    if framework not in spec.frameworks:
        raise ValueError(f"fault {fault} does not exist on {framework}")
    if style is not None and framework != "mindspore":
        raise ValueError("--style applies to --framework mindspore only")
    if style is not None and style not in MS_STYLES:
        raise ValueError(f"style {style!r} is not one of {', '.join(MS_STYLES)}")
    if style in spec.ms_styles_not_on:
        raise ValueError(f"fault {fault} is not built in the {style} style: {spec.ms_styles_not_on[style]}")
    out = Path(out or f"runs/{fault}{'-' + variant if variant else ''}-w{world_size}-s{seed}")
    _clear(out)
    (out / "plans").mkdir(parents=True)
    plans = plans_for(fault, variant, world_size, steps=steps, onset=onset, seed=seed, pg_timeout_s=pg_timeout_s)
    for plan in plans:
        plan.extra.update({"probe": probe, "check_every": check_every, "on_mismatch": on_mismatch})
        if style is not None:
            plan.extra["style"] = style
        (out / "plans" / f"plan{plan.rank}.json").write_text(json.dumps(plan.to_json(), indent=1))
    timeout_s = STARTUP_BUDGET_S + 3 * pg_timeout_s + steps * 0.5 * world_size
    t0 = time.monotonic()
    if framework == "mindspore":
        from syncdoctor.lab.mindspore_runner import run_mindspore_lab

        # msrun starts a scheduler beside the ranks, and each imports MindSpore (≈3× torch's start-up).
        ms = run_mindspore_lab(plans, out, timeout_s + STARTUP_BUDGET_S)
        codes, timed_out, started = [ms["returncode"]], bool(ms["timed_out"]), "spawned"
    else:
        codes, timed_out, started = _run_torch(plans, out, timeout_s)
    result = LabResult(fault, variant, framework, world_size, out, codes, timed_out, time.monotonic() - t0)
    result.started = started
    for rank in range(world_size):
        path = out / f"result{rank}.json"
        if path.exists():
            data = json.loads(path.read_text())
            result.accuracy[rank] = data["accuracy"]
            result.steps_done[rank] = data["steps"]
    (out / "lab.json").write_text(json.dumps(result.to_json(), indent=1))
    return result


def _clear(out: Path) -> None:
    """A run folder holds exactly one run. When it is also the folder of the `syncdoctor
    run` (or `syncdoctor experiment`) this lab run is started by, what that command put
    there first (the probe's boot files, its logs, run.json) stays."""
    if not out.exists():
        return
    outer = os.environ.get(RUN_DIR_ENV)
    if not outer or Path(outer).resolve() != out.resolve():
        shutil.rmtree(out)
        return
    for entry in out.iterdir():
        if entry.name in (".syncdoctor", "logs", "run.json"):
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()


def _run_torch(plans: list, out: Path, timeout_s: float) -> tuple[list[int | None], bool, str]:
    """The ranks of one run, forked from the fork server (lab/forkserver.py: torch is
    imported once for all of them) or, under `syncdoctor run` (whose sitecustomize must
    run as each rank's interpreter starts) and where the server cannot start, spawned."""
    port = free_port()
    argvs, envs, logs = [], [], []
    for plan in plans:
        env = dict(os.environ)
        env.update(
            {
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(port),
                "RANK": str(plan.rank),
                "LOCAL_RANK": str(plan.rank),
                "WORLD_SIZE": str(plan.world_size),
                "LOCAL_WORLD_SIZE": str(plan.world_size),
                "OMP_NUM_THREADS": "1",
                "GLOO_SOCKET_IFNAME": "lo",
                "PYTHONUNBUFFERED": "1",
            }
        )
        argvs.append([str(out / "plans" / f"plan{plan.rank}.json")])
        envs.append(env)
        logs.append(out / f"train.log{plan.rank}")
    module = "syncdoctor.lab.train_torch"
    if os.environ.get(SPAWN_ENV) != "1" and not os.environ.get(RUN_DIR_ENV):
        try:
            server = forkserver.shared_server()
            return (*forkserver.run_forked_ranks(server, module, argvs, envs, logs, timeout_s), "forked")
        except forkserver.ForkServerError:
            pass  # spawned instead: slower, never worse
    commands = [[sys.executable, "-m", module, *argv] for argv in argvs]
    return (*run_ranks(commands, envs, logs, timeout_s), "spawned")
