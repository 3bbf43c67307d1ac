"""MindSpore tests: skipped with the reason when the extra is not installed here.

Every msrun job of the MindSpore tests runs once per session, through one cache
(`ms_jobs`): the first test that needs any job starts all of them, JOBS_AT_ONCE at a
time (a job is mostly start-up: three processes importing MindSpore, then waiting
on each other), and each test waits only for its own. Whatever happens, no process
naming a job's folder survives it (the launchers sweep /proc by pid).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from syncdoctor.settings import CHECK_EVERY_ENV, VALIDATE_RECORDS_ENV

try:
    import mindspore  # noqa: F401

    MS_MISSING = None
except Exception as exc:  # no wheel for this platform, or numpy 2 in the way
    MS_MISSING = f"mindspore is not importable here ({exc!r}); install syncdoctor[mindspore]"

JOBS_AT_ONCE = 4  # on 2 cores: the failing jobs spend their last seconds waiting on a timeout
BOUND_S = 420.0  # one job, start-up included: ~40 s alone, minutes on a crowded machine
HERE = Path(__file__).parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/mindspore" in str(item.fspath).replace("\\", "/"):
            item.add_marker(pytest.mark.mindspore)
            if MS_MISSING:
                item.add_marker(pytest.mark.skip(reason=MS_MISSING))


def run_dir_entry(out: Path) -> str:
    """The environment entry every process of a `syncdoctor run --out OUT` job carries."""
    return f"SYNCDOCTOR_RUN_DIR={out}"


def ops_dir(out: Path) -> Path:
    """Where a job's user_ops outcomes go (OPS=1), beside its run folder."""
    return out.with_name(out.name + "-ops")


def zero_code_run(
    out: Path, env: dict[str, str], script: Path = HERE / "user_train.py", probe: bool = True
) -> dict[str, Any]:
    """`syncdoctor run --out OUT -- msrun ... SCRIPT`, as a user types it (probe=False:
    the msrun command alone); msrun's own logs go beside OUT, as they would in the
    user's working directory. Bounded: SIGINT to the whole group at BOUND_S (SIGTERM
    would orphan msrun's workers), then SIGKILL."""
    import signal
    import time

    from syncdoctor.lab.launch import free_port
    from syncdoctor.lab.mindspore_runner import _kill_group, _sweep

    bin_dir = Path(sys.executable).parent
    # K=10, as these jobs were written for (32 steps): the probes' shared default is 50.
    child_env = {
        **os.environ,
        CHECK_EVERY_ENV: "10",
        VALIDATE_RECORDS_ENV: "1",
        **env,
        "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
        "OMP_NUM_THREADS": "1",
        "GLOG_v": "2",
        # What marks every process of this job, for the sweep below (set, not read, without the probe).
        "SYNCDOCTOR_RUN_DIR": str(out),
    }
    if child_env.pop("OPS", None):
        child_env["OPS_DIR"] = str(ops_dir(out))
    msrun_logs = out.with_name(out.name + "-msrun")
    cmd = [
        *([str(bin_dir / "syncdoctor"), "run", "--out", str(out), "--"] if probe else []),
        str(bin_dir / "msrun"),
        "--worker_num=2",
        "--local_worker_num=2",
        "--master_addr=127.0.0.1",
        f"--master_port={free_port()}",
        f"--log_dir={msrun_logs}",
        "--join=True",
        "--cluster_time_out=60",
        str(script),
    ]
    t0 = time.monotonic()
    with open(out.with_name(out.name + ".out"), "wb") as log:
        proc = subprocess.Popen(cmd, env=child_env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        timed_out = False
        try:
            proc.wait(timeout=BOUND_S)
        except subprocess.TimeoutExpired:
            timed_out = True
            os.killpg(proc.pid, signal.SIGINT)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    # msrun starts the workers as `python SCRIPT`: what marks them as this run's is the
    # SYNCDOCTOR_RUN_DIR they inherit. Whatever is left is killed, and reported.
    survivors = _sweep(str(out), env=run_dir_entry(out))
    _kill_group(proc.pid, signal.SIGKILL)
    return {
        "dir": out,
        "returncode": proc.returncode,
        "timed_out": timed_out,
        "survivors": survivors,
        "duration_s": round(time.monotonic() - t0, 1),
        "logs": sorted(str(p) for p in msrun_logs.glob("*.log")),
    }


class Jobs:
    """name -> a job started at most once per session; `get` waits for it."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.pool = ThreadPoolExecutor(JOBS_AT_ONCE)
        self.futures: dict[str, Future[dict[str, Any]]] = {}
        self.specs: dict[str, Callable[[Path], dict[str, Any]]] = {}

    def define(self, name: str, job: Callable[[Path], dict[str, Any]]) -> None:
        self.specs.setdefault(name, job)

    def start(self, names: list[str]) -> None:
        for name in names:
            if name not in self.futures:
                self.futures[name] = self.pool.submit(self.specs[name], self.root / name)

    def get(self, name: str) -> dict[str, Any]:
        # SYNCDOCTOR_MS_JOBS=a,b: start only those at once (the others when a test asks).
        only = [n for n in os.environ.get("SYNCDOCTOR_MS_JOBS", "").split(",") if n in self.specs]
        self.start([name, *(only or self.specs)])
        return self.futures[name].result()


# -- every job of the session ---------------------------------------------------------------
# Zero-code: tests/mindspore/user_train.py under `syncdoctor run -- msrun`, in every style.
UNSEEDED, SUMMED, EVAL_RANK_1 = {"SEED": "0"}, {"GRAD_MEAN": "0"}, {"EVAL_RANK": "1"}
ZERO_CODE: dict[str, dict[str, str]] = {}
for _style in ("model", "cell", "functional"):
    for _case, _env in (("clean", {}), ("unseeded", UNSEEDED), ("summed", SUMMED), ("eval-rank", EVAL_RANK_1)):
        ZERO_CODE[f"zc-{_style}-{_case}"] = {"STYLE": _style, **_env}
for _style in ("cell-graph", "jit"):  # GRAPH mode and a jitted step: the baseline, and the three faults at once
    ZERO_CODE[f"zc-{_style}-clean"] = {"STYLE": _style}
    ZERO_CODE[f"zc-{_style}-three"] = {"STYLE": _style, **UNSEEDED, **SUMMED, **EVAL_RANK_1}
# The settings that decide the reduce, read at start (a jitted step: nothing else shows
# them), a reducer that averages while the context says otherwise (healthy), a mean
# written by hand (no reducer to read: inconclusive), and a per-rank dataset seed.
ZERO_CODE["zc-jit-reducer-sum"] = {"STYLE": "jit", "REDUCER_MEAN": "0"}
ZERO_CODE["zc-jit-reducer-degree"] = {"STYLE": "jit", "REDUCER_MEAN": "1", "REDUCER_DEGREE": "4"}
ZERO_CODE["zc-jit-mean-ctxfalse"] = {"STYLE": "jit", "REDUCER_MEAN": "1", "GRAD_MEAN": "0"}
ZERO_CODE["zc-jit-opsreduce"] = {"STYLE": "jit", "REDUCE": "ops"}
ZERO_CODE["zc-functional-dsseed"] = {"STYLE": "functional", "DS_SEED_BY_RANK": "1"}
# The clean jobs also run user_ops.py's operations; each has a twin without the probe.
OPS_STYLES = ("model", "cell", "functional", "cell-graph", "jit")
for _style in OPS_STYLES:
    ZERO_CODE[f"zc-{_style}-clean"]["OPS"] = "1"
PLAIN = {
    f"plain-{style}-clean": {"STYLE": style, "OPS": "1"} for style in OPS_STYLES
}  # no name a prefix of another: the sweep matches by folder

# The lab (lab/train_mindspore.py, probe attached zero-code by the runner): each fault the
# zero-code jobs above do not already prove, once; two of them in the cell and model
# styles, so that each style of the lab runs here (`lab matrix --style` runs them all).
LAB_COMMON = {"steps": 40, "onset": 20, "pg_timeout_s": 8.0}  # 2 epochs of 22 steps
LAB: dict[str, tuple[str, str, dict[str, Any]]] = {
    "clean": ("clean", "", {}),
    "init-graph-broadcast": ("init-mismatch", "", {"extra": {"ms_mode": "graph", "parameter_broadcast": True}}),
    "unseeded-shuffle": ("unseeded-shuffle", "", {}),
    "shuffle-after-shard": ("shuffle-after-shard", "", {}),
    "uneven-keep": ("uneven-shards", "keep_remainder", {}),
    "uneven-drop": ("uneven-shards", "drop_remainder", {}),
    "accum-no_sync": ("grad-accum-misaligned", "no_sync", {}),
    "model-loss-hparam-mismatch": ("loss-hparam-mismatch", "", {"extra": {"style": "model"}}),
    "optimizer-state-mismatch": ("optimizer-state-mismatch", "", {}),
    "cell-mode-mismatch": ("mode-mismatch", "", {"extra": {"style": "cell"}}),
    "fp16-no_scaling": ("fp16-overflow", "no_scaling", {}),
    "fp16-local_skip": ("fp16-overflow", "local_skip", {}),
    "rank-crash": ("rank-crash", "", {}),
}


def lab_run(name: str, out: Path) -> dict[str, Any]:
    from syncdoctor.lab.faults import plans_for
    from syncdoctor.lab.mindspore_runner import run_mindspore_lab
    from syncdoctor.lab.runner import LAB_CHECK_EVERY

    fault, variant, extra = LAB[name]
    plans = plans_for(fault, variant, 2, **{**LAB_COMMON, **extra})
    for plan in plans:  # K as `syncdoctor lab run` sets it (the probes' shared default is 50)
        plan.extra.setdefault("check_every", LAB_CHECK_EVERY)
    result = run_mindspore_lab(plans, out, timeout_s=BOUND_S)
    result["dir"] = out
    return result


@pytest.fixture(scope="session")
def ms_jobs(tmp_path_factory: pytest.TempPathFactory):
    import functools

    keep = os.environ.get("SYNCDOCTOR_MS_JOBS_DIR")  # to look at the runs afterwards
    root = Path(keep) if keep else tmp_path_factory.mktemp("msjobs")
    root.mkdir(parents=True, exist_ok=True)
    jobs = Jobs(root)
    for name in LAB:  # in the order the test modules ask for them
        jobs.define(name, functools.partial(lab_run, name))
    for name, env in ZERO_CODE.items():
        jobs.define(name, functools.partial(zero_code_run, env=env))
    for name, env in PLAIN.items():
        jobs.define(name, functools.partial(zero_code_run, env=env, probe=False))
    yield jobs
    jobs.pool.shutdown(wait=True)
