"""Launch one MindSpore lab run through msrun and make sure nothing of it survives.

msrun starts a scheduler and N workers, each running lab/train_mindspore.py PLAN_DIR;
the workers' stdout lands in OUT/worker_N.log, the scheduler's in OUT/scheduler.log.
Measured (shared/facts.md): SIGTERM to msrun orphans the workers, SIGINT stops them
cleanly; so the bound is SIGINT first, then SIGKILL to msrun's process group, then a
sweep of /proc for any process whose command line names this run's plan directory
(only those pids, never by name).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from syncdoctor import settings
from syncdoctor.lab.launch import free_port
from syncdoctor.lab.plan import RankPlan

TRAIN_SCRIPT = Path(__file__).with_name("train_mindspore.py")
SIGINT_GRACE_S = 10.0  # msrun forwards SIGINT to its workers and exits within a few seconds


def find_msrun(python: str | None = None) -> list[str]:
    """msrun next to the interpreter that has MindSpore, else on PATH, else `python -m`."""
    exe = Path(python or sys.executable)
    candidate = exe.parent / "msrun"
    if candidate.exists():
        return [str(candidate)]
    found = shutil.which("msrun")
    if found:
        return [found]
    return [str(exe), "-m", "mindspore.parallel.cluster.run"]


def pids_naming(marker: str, env: str | None = None) -> list[int]:
    """Pids of live processes whose command line contains `marker` (the plan directory),
    or, with `env` ("NAME=value"), whose environment holds that exact entry: msrun starts
    a user's workers as `python train.py`, whose command line names no run folder, but
    each inherits `syncdoctor run`'s SYNCDOCTOR_RUN_DIR."""
    out = []
    me = os.getpid()
    wanted = env.encode() if env else None
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            if marker in cmdline or (wanted and wanted in (entry / "environ").read_bytes().split(b"\0")):
                out.append(int(entry.name))
        except OSError:  # gone meanwhile, or not ours to read
            continue
    return out


def _kill_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _sweep(marker: str, deadline_s: float = 5.0, env: str | None = None) -> list[int]:
    """SIGKILL every process of this run still alive (see pids_naming); returns the pids
    that had survived."""
    survivors = pids_naming(marker, env)
    for pid in survivors:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    end = time.monotonic() + deadline_s
    while time.monotonic() < end and pids_naming(marker, env):
        time.sleep(0.1)
    return survivors


def run_msrun(
    script: str | Path,
    args: list[str],
    out: Path,
    world: int,
    timeout_s: float,
    *,
    marker: str,
    python: str | None = None,
    env: dict[str, str] | None = None,
    comm_timeout_s: float = 20.0,
) -> dict[str, Any]:
    """msrun SCRIPT ARGS with N local workers, logs in OUT; bounded by timeout_s, and
    afterwards no process whose command line contains `marker` survives."""
    out = Path(out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    cmd = [
        *find_msrun(python),
        f"--worker_num={world}",
        f"--local_worker_num={world}",
        "--master_addr=127.0.0.1",
        f"--master_port={free_port()}",
        f"--log_dir={out}",
        "--join=True",
        "--cluster_time_out=60",
        str(script),
        *args,
    ]
    child_env = dict(os.environ)
    # msrun starts each worker as a bare `python` found on PATH, not with its own
    # interpreter (mindspore/parallel/cluster/process_entity/_utils.py): put ours first.
    bindir = str(Path(python or sys.executable).parent)
    child_env["PATH"] = bindir + os.pathsep + child_env.get("PATH", "")
    # The collective timeout maps onto MindSpore's CPU ones: how long a collective waits
    # for a peer, and how soon the scheduler declares a silent node dead. With the
    # defaults a lost peer costs ≈30 s; the variables exist in 2.10's libmindspore_cluster.
    timeout = str(max(8, int(comm_timeout_s)))
    child_env.update(
        {
            "OMP_NUM_THREADS": "1",
            "GLOG_v": child_env.get("GLOG_v", "2"),
            "PYTHONUNBUFFERED": "1",
            "MS_CPU_COMM_OP_TIMEOUT": timeout,
            "MS_NODE_TIMEOUT": timeout,
        }
    )
    child_env.update(env or {})
    t0 = time.monotonic()
    timed_out = False
    with open(out / "msrun.log", "wb") as log:
        proc = subprocess.Popen(
            cmd, cwd=out, stdout=log, stderr=subprocess.STDOUT, env=child_env, start_new_session=True
        )  # its own process group: one killpg reaches all
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            # SIGINT to the group: msrun and its workers shut down in order (SIGTERM orphans them).
            _kill_group(proc.pid, signal.SIGINT)
            try:
                proc.wait(timeout=SIGINT_GRACE_S)
            except subprocess.TimeoutExpired:
                _kill_group(proc.pid, signal.SIGKILL)
                proc.wait()
    duration = time.monotonic() - t0
    # msrun may have exited while a worker it lost track of still runs: reap its group,
    # then anything else that names this run.
    _kill_group(proc.pid, signal.SIGKILL)
    survivors = _sweep(marker)
    return {
        "returncode": proc.returncode,
        "duration_s": round(duration, 2),
        "logs": sorted(str(p) for p in out.glob("*.log")),
        "timed_out": timed_out,
        "survivors": survivors,
        "framework": "mindspore",
        "command": cmd,
    }


def zero_code_env(out: Path, check_every: int | None = None) -> dict[str, str]:
    """The environment `syncdoctor run` gives a command (its sitecustomize first on
    PYTHONPATH), so the probe attaches to the lab script as to any user's script; less
    the copy of each rank's output, which msrun already writes to worker_N.log."""
    from syncdoctor.probe.run.launcher import prepare

    env = prepare(out, check_every, None, env=dict(os.environ))
    env.pop(settings.AUTO_ENV, None)
    return {k: env[k] for k in ("PYTHONPATH", settings.RUN_DIR_ENV, settings.CHECK_EVERY_ENV) if k in env}


def run_mindspore_lab(
    plans: list[RankPlan],
    out: Path,
    timeout_s: float = 180.0,
    python: str | None = None,
    env: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Run one lab job: writes OUT/plans/plan{R}.json, launches msrun, bounds it by
    timeout_s and returns {"returncode", "duration_s", "logs", "timed_out", "survivors",
    "ranks"}. Records land in OUT/records/rank{R}.jsonl, per-rank results in OUT/result{R}.json."""
    out = Path(out).resolve()
    plan_dir = out / "plans"
    plan_dir.mkdir(parents=True, exist_ok=True)
    for plan in plans:
        (plan_dir / f"plan{plan.rank}.json").write_text(json.dumps(plan.to_json(), indent=1))
    env = dict(env or {})
    if plans[0].extra.get("probe", True):
        env.update(zero_code_env(out, plans[0].extra.get("check_every")))
    result = run_msrun(
        TRAIN_SCRIPT,
        [str(plan_dir)],
        out,
        len(plans),
        timeout_s,
        marker=str(plan_dir),
        python=python,
        env=env,
        comm_timeout_s=plans[0].pg_timeout_s,
    )
    ranks = []
    for plan in plans:
        try:
            ranks.append(json.loads((out / f"result{plan.rank}.json").read_text()))
        except (OSError, ValueError):
            ranks.append({"rank": plan.rank, "steps": None, "accuracy": None})
    result["ranks"] = ranks
    return result
