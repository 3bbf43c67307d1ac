"""The zoo's runs, shared by every test through one session-wide cache: each
(program, bug, mode) is launched once per session. Set SYNCDOCTOR_ZOO_DIR to keep
the run folders and reuse them across sessions (a run folder with its result.json
is not run again)."""

from __future__ import annotations

import contextlib
import io
import json
import os
import resource
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from syncdoctor.lab.launch import free_port
from tests.zoo.scenarios import CHECK_EVERY, PROGRAMS, PROGRAMS_DIR, STEPS

RUN_TIMEOUT_S = 600
SYNCDOCTOR = [sys.executable, "-c", "import sys; from syncdoctor.cli import main; sys.exit(main())"]
MODES = ("plain", "zero", "attach")


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
        return [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                "--master-addr", "127.0.0.1", "--master-port", str(free_port()), script, *args]
    if spec.launcher == "accelerate":
        return [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
                "--main_process_port", str(free_port()), script, *args]
    raise ValueError(spec.launcher)


def _env() -> dict[str, str]:
    env = dict(os.environ, OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo", TOKENIZERS_PARALLELISM="false",
               HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_DATASETS_OFFLINE="1",
               TRANSFORMERS_NO_ADVISORY_WARNINGS="1", PYTHONUNBUFFERED="1")
    env.pop("SYNCDOCTOR_RUN_DIR", None)
    return env


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _run(command: list[str], log: Path) -> tuple[int, float, float]:
    start, cpu = time.monotonic(), _children_cpu()
    with open(log, "wb") as out:
        proc = subprocess.Popen(command, cwd=PROGRAMS_DIR, env=_env(), stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            code = proc.wait(timeout=RUN_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            code = -9
    return code, time.monotonic() - start, _children_cpu() - cpu


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
    out = root / f"{program}-{bug or 'healthy'}-{mode}"
    saved = out / "result.json"
    if saved.exists():
        data = json.loads(saved.read_text())
        data["finals"] = {int(k): v for k, v in data["finals"].items()}
        run = ZooRun(**{**data, "folder": Path(data["folder"])})
        if mode != "plain":  # the doctor may have changed since: diagnose again
            run.diagnose_code, run.diagnosis = diagnose_json(run.folder)
        return run
    out.mkdir(parents=True, exist_ok=True)
    final = out / "final"
    args = ["--steps", str(STEPS), "--final-dir", str(final)]
    if bug:
        args += ["--bug", bug]
    folder = out / "probe"
    if mode == "attach":
        args += ["--syncdoctor", str(folder), "--check-every", str(CHECK_EVERY)]
    command = launcher_command(program, args)
    if mode == "zero":
        command = [*SYNCDOCTOR, "run", "--out", str(folder), "--check-every", str(CHECK_EVERY), "--", *command]
    code, seconds, cpu_s = _run(command, out / "output.log")
    finals = {int(f.stem.removeprefix("final")): f.read_text().strip() for f in final.glob("final*.sha256")}
    run = ZooRun(program, bug, mode, folder, code, finals, seconds,
                 (out / "output.log").read_text(errors="replace")[-4000:], cpu_s)
    if mode != "plain":
        run.diagnose_code, run.diagnosis = diagnose_json(folder)
    if os.environ.get("SYNCDOCTOR_ZOO_DIR"):
        kept = {**run.__dict__, "folder": str(folder), "diagnosis": None, "diagnose_code": None}
        saved.write_text(json.dumps(kept, default=str))
    return run


@pytest.fixture(scope="session")
def zoo(tmp_path_factory: pytest.TempPathFactory):
    keep = os.environ.get("SYNCDOCTOR_ZOO_DIR")
    root = Path(keep) if keep else tmp_path_factory.mktemp("zoo")
    cache: dict[tuple[str, str, str], ZooRun] = {}

    def run(program: str, bug: str, mode: str) -> ZooRun:
        key = (program, bug, mode)
        if key not in cache:
            cache[key] = launch(root, program, bug, mode)
        return cache[key]

    return run
