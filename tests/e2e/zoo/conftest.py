"""The zoo's runs, shared by every test through one session-wide cache: each
(program, bug, mode) is launched once per session. Set SYNCDOCTOR_ZOO_DIR to keep
the run folders and reuse them across sessions (a run folder with its result.json
is not run again).

The runs the selected tests need are launched ahead, SYNCDOCTOR_ZOO_JOBS at a time
(default 2): a launcher and its ranks leave a core idle for a good part of a run
(rendezvous, imports in one process while the other waits), so two at once take
about two thirds of the time. Diagnoses stay on the test's own thread."""

from __future__ import annotations

import contextlib
import io
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from syncdoctor.lab.launch import free_port
from tests.e2e.zoo.scenarios import CHECK_EVERY, PROGRAMS, PROGRAMS_DIR, STEPS, modes_of

RUN_TIMEOUT_S = 600
JOBS = max(1, int(os.environ.get("SYNCDOCTOR_ZOO_JOBS", "2")))
_running: set[subprocess.Popen[bytes]] = set()  # launched runs not yet ended: ended at teardown
_running_lock = threading.Lock()
SYNCDOCTOR = [sys.executable, "-c", "import sys; from syncdoctor.cli import main; sys.exit(main())"]
MODES = ("plain", "zero", "attach")
WORLD_SIZE = 2  # every zoo program trains on two ranks
# torch can abort a process while the interpreter finalizes, after the script returned:
# a C++ worker thread drops its last Python reference while the GIL is torn down, and
# libstdc++ prints this line (pytorch/pytorch#190489; seen once on a plain accelerate
# run of ours, with no probe in the process, in about 150 such runs).
EXIT_ABORT = "terminate called without an active exception"


@dataclass
class ZooRun:
    program: str
    bug: str
    mode: str
    folder: Path  # what `syncdoctor diagnose` reads (zero: the run folder; attach: the probe's run_dir)
    returncode: int
    finals: dict[int, str]  # rank -> sha256 of the final state_dict
    seconds: float
    output: str
    cpu_s: float | None = None  # user+system CPU of every process the run started
    diagnosis: dict[str, Any] | None = None
    diagnose_code: int | None = None
    aborted_at_exit: int = 0  # runs before this one that finished training, then hit EXIT_ABORT
    ops: dict[int, dict[str, dict[str, str]]] | None = None  # rank -> moment -> operation -> outcome (user_ops)

    @property
    def top(self) -> dict[str, Any] | None:
        findings = (self.diagnosis or {}).get("findings") or []
        return findings[0] if findings else None


def launcher_command(program: str, args: list[str]) -> list[str]:
    spec = PROGRAMS[program]
    script = str(PROGRAMS_DIR / spec.script)
    if spec.launcher == "own":
        return [sys.executable, script, *args]
    if spec.launcher == "torchrun":
        return [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc-per-node",
            str(WORLD_SIZE),
            "--master-addr",
            "127.0.0.1",
            "--master-port",
            str(free_port()),
            script,
            *args,
        ]
    if spec.launcher == "accelerate":
        return [
            sys.executable,
            "-m",
            "accelerate.commands.launch",
            "--multi_gpu",
            "--num_processes",
            str(WORLD_SIZE),
            "--main_process_port",
            str(free_port()),
            script,
            *args,
        ]
    raise ValueError(spec.launcher)


def _env() -> dict[str, str]:
    env = dict(
        os.environ,
        OMP_NUM_THREADS="1",
        GLOO_SOCKET_IFNAME="lo",
        TOKENIZERS_PARALLELISM="false",
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        TRANSFORMERS_NO_ADVISORY_WARNINGS="1",
        PYTHONUNBUFFERED="1",
    )
    env.pop("SYNCDOCTOR_RUN_DIR", None)
    return env


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _end(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)  # its own session: the launcher and every rank
    proc.wait()


def _run(command: list[str], log: Path) -> tuple[int, float, float | None]:
    """Exit code, seconds, and the CPU seconds of the processes it started (None when
    runs overlap: the children's CPU is counted per process, not per run)."""
    start, cpu = time.monotonic(), _children_cpu()
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            command,
            cwd=PROGRAMS_DIR,
            env=_env(),
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        with _running_lock:
            _running.add(proc)
        try:
            code = proc.wait(timeout=RUN_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            _end(proc)
            code = -9
        finally:
            with _running_lock:
                _running.discard(proc)
    return code, time.monotonic() - start, (_children_cpu() - cpu) if JOBS == 1 else None


def diagnose_json(folder: Path) -> tuple[int, dict[str, Any] | None]:
    """`syncdoctor diagnose FOLDER --json`, in process."""
    from syncdoctor.cli import main

    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        code = main(["diagnose", str(folder), "--json"])
    try:
        return code, json.loads(buffer.getvalue())
    except json.JSONDecodeError:
        return code, None


def launch(root: Path, program: str, bug: str, mode: str) -> ZooRun:
    """Run (or take the kept run of) one scenario; not yet diagnosed."""
    out = root / f"{program}-{bug or 'healthy'}-{mode}"
    saved = out / "result.json"
    if saved.exists():
        data = json.loads(saved.read_text())
        data["finals"] = {int(k): v for k, v in data["finals"].items()}
        data["ops"] = {int(k): v for k, v in (data.get("ops") or {}).items()}
        return ZooRun(**{**data, "folder": Path(data["folder"])})  # diagnosed again: the doctor may have changed
    out.mkdir(parents=True, exist_ok=True)
    final = out / "final"
    args = ["--steps", str(STEPS), "--final-dir", str(final)]
    if bug:
        args += ["--bug", bug]
    else:  # the healthy runs: what users do to their objects, with and without the probe
        args += ["--ops-dir", str(final)]
    folder = out / "probe"
    if mode == "attach":
        args += ["--syncdoctor", str(folder), "--check-every", str(CHECK_EVERY)]
    command = launcher_command(program, args)
    if mode == "zero":
        command = [*SYNCDOCTOR, "run", "--out", str(folder), "--check-every", str(CHECK_EVERY), "--", *command]
    aborted_at_exit = 0
    while True:
        code, seconds, cpu_s = _run(command, out / "output.log")
        finals = {int(f.stem.removeprefix("final")): f.read_text().strip() for f in final.glob("final*.sha256")}
        ops = {int(f.stem.removeprefix("ops")): json.loads(f.read_text()) for f in final.glob("ops*.json")}
        output = (out / "output.log").read_text(errors="replace")
        # Run again, once, only what torch's exit race ended after every rank had
        # finished training and saved its weights: a crash of the probe or of the
        # training, a lost rank or a second abort still reach the test.
        if code == 0 or aborted_at_exit or len(finals) < WORLD_SIZE or EXIT_ABORT not in output:
            break
        aborted_at_exit += 1
        warnings.warn(
            f"zoo {program} {bug or 'healthy'} {mode}: torch aborted at exit after training; run again", stacklevel=1
        )
        for made in (final, folder):
            shutil.rmtree(made, ignore_errors=True)
    run = ZooRun(
        program,
        bug,
        mode,
        folder,
        code,
        finals,
        seconds,
        output[-4000:],
        cpu_s,
        aborted_at_exit=aborted_at_exit,
        ops=ops,
    )
    if os.environ.get("SYNCDOCTOR_ZOO_DIR"):
        kept = {**run.__dict__, "folder": str(folder), "diagnosis": None, "diagnose_code": None}
        saved.write_text(json.dumps(kept, default=str))
    return run


def runs_needed(item: pytest.Item) -> list[tuple[str, str, str]]:
    """The (program, bug, mode) runs a collected zoo test will ask for."""
    params = getattr(getattr(item, "callspec", None), "params", {})
    program, bug = params.get("program"), params.get("bug", "")
    if program is None:
        return []
    name = getattr(item, "originalname", item.name)
    if name == "test_probe_changes_nothing":
        return [(program, "", mode) for mode in MODES]
    if name == "test_bug_really_changes_training":
        return [(program, "", "zero"), *((program, bug, mode) for mode in modes_of(program, bug))]
    return [(program, bug, params["mode"])] if "mode" in params else []


@pytest.fixture(scope="session")
def zoo(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator:
    keep = os.environ.get("SYNCDOCTOR_ZOO_DIR")
    root = Path(keep) if keep else tmp_path_factory.mktemp("zoo")
    pool = ThreadPoolExecutor(max_workers=JOBS, thread_name_prefix="zoo")
    launched: dict[tuple[str, str, str], Future[ZooRun]] = {}
    cache: dict[tuple[str, str, str], ZooRun] = {}

    def ahead(key: tuple[str, str, str]) -> None:
        if key not in launched:
            launched[key] = pool.submit(launch, root, *key)

    for item in request.session.items:  # in test order: the first test's runs start first
        for key in runs_needed(item):
            ahead(key)

    def run(program: str, bug: str, mode: str) -> ZooRun:
        key = (program, bug, mode)
        if key not in cache:
            ahead(key)
            result = launched[key].result()
            if mode != "plain":
                result.diagnose_code, result.diagnosis = diagnose_json(result.folder)
            cache[key] = result
        return cache[key]

    try:
        yield run
    finally:  # an interrupted session: no run is left behind, none still queued starts
        pool.shutdown(wait=False, cancel_futures=True)
        with _running_lock:
            still = list(_running)
        for proc in still:
            _end(proc)
        pool.shutdown(wait=True)
