"""The probe never raises into user code: each of its hook points made to raise (by
scripts/inject_failure.py) in a real 2-rank DDP job under `syncdoctor run`; the job
ends with its own exit code and bitwise the same final parameters as without the
probe, the rank says once that its probe stood down, and the records say so too.

Each launch breaks two hook points, one per rank, so a rank's probe stands down while
its peer's goes on checking (six launches for twelve points, and the harder case: a
probe that fails on one rank only must not leave the other waiting for it)."""

from __future__ import annotations

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from syncdoctor.lab.launch import free_port
from syncdoctor.records import read_run

pytestmark = pytest.mark.slow

SCRIPTS = Path(__file__).parent / "scripts"
SYNCDOCTOR = [sys.executable, "-c", "import sys; from syncdoctor.cli import main; sys.exit(main())"]
TIMEOUT_S = 240
# Where each hook point's own work starts: a failure there is what the fence must hold.
HOOK_POINTS = {
    "init_process_group": "syncdoctor.probe.torch.attach:_after_init",
    "DDP construction": "syncdoctor.probe.torch.attach:_attach_ddp",
    "backward": "syncdoctor.probe.torch.attach:_capture_loss",
    "optimizer step (global)": "syncdoctor.probe.torch.attach:_probe_for_optimizer",
    "GradScaler step": "syncdoctor.probe.torch.attach:_scaler_before",
    "forward start": "syncdoctor.probe.torch.probe:Probe._on_forward_start",
    "forward end": "syncdoctor.probe.torch.probe:Probe._on_forward_end",
    "local gradient": "syncdoctor.probe.torch.probe:Probe._on_local_grad",
    "optimizer step (probe)": "syncdoctor.probe.torch.probe:Probe._after_step_hook",
    "check-step measurement": "syncdoctor.probe.torch.probe:Probe._measurements",
    "live check": "syncdoctor.probe.torch.check:CrossRankCheck.submit",
    "record writer": "syncdoctor.records.writer:RecordWriter.append",
}
UNRECORDABLE = {"record writer"}  # a writer that fails cannot record its own failure: stderr says it
STOOD_DOWN = ("syncdoctor: probe disabled on rank", "syncdoctor: probe off on this process")


LAUNCHES = [tuple(list(HOOK_POINTS)[i : i + 2]) for i in range(0, len(HOOK_POINTS), 2)]  # (rank 0's, rank 1's)


def _launch(out: Path, hooks: tuple[str, ...]) -> tuple[subprocess.CompletedProcess[str], dict[str, str]]:
    final = out / "final"
    script = [str(SCRIPTS / "contained_job.py"), str(final)]
    if hooks:
        script = [str(SCRIPTS / "inject_failure.py"), ",".join(HOOK_POINTS[h] for h in hooks), *script]
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2"]
    command += ["--master-addr", "127.0.0.1", "--master-port", str(free_port()), *script]
    if hooks:
        command = [*SYNCDOCTOR, "run", "--out", str(out / "run"), "--check-every", "5", "--", *command]
    proc = subprocess.run(
        command,
        env=dict(os.environ, OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo"),
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        stdin=subprocess.DEVNULL,
    )
    finals = {f.name: f.read_text() for f in sorted(final.glob("final*.sha256"))}
    return proc, finals


@pytest.fixture(scope="module")
def runs(
    tmp_path_factory: pytest.TempPathFactory,
) -> dict[tuple[str, ...], tuple[subprocess.CompletedProcess[str], dict[str, str]]]:
    root = tmp_path_factory.mktemp("contained")
    launches: list[tuple[str, ...]] = [(), *LAUNCHES]
    with ThreadPoolExecutor(2) as pool:  # a launch leaves a core idle for much of its time
        done = pool.map(lambda hooks: _launch(root / str(launches.index(hooks)), hooks), launches)
        return dict(zip(launches, done, strict=True))


# The first test's setup makes all 7 launches of the module's fixture, two at a time:
# on 2 cores beside another worker's launches that is more than one test's 300 s.
@pytest.mark.timeout(TIMEOUT_S * 4)
@pytest.mark.parametrize("hook", list(HOOK_POINTS))
def test_a_failing_hook_point_never_reaches_training(runs, hook: str, tmp_path: Path) -> None:
    plain, plain_finals = runs[()]
    assert plain.returncode == 0 and len(plain_finals) == 2, plain.stderr[-2000:]
    proc, finals = next(runs[hooks] for hooks in LAUNCHES if hook in hooks)
    assert proc.returncode == plain.returncode, proc.stderr[-3000:]
    assert finals == plain_finals  # bitwise the same training
    said = [line for line in proc.stderr.splitlines() if line.startswith(STOOD_DOWN)]
    assert all("injected failure" in line for line in said), proc.stderr[-3000:]
    injected = f"injected failure in {HOOK_POINTS[hook]}"
    said_here = [line for line in said if injected in line]
    assert len(said_here) == 1, proc.stderr[-3000:]  # once, by the rank it broke
    run_dir = Path(proc.args[proc.args.index("--out") + 1])
    if "probe disabled" in said_here[0] and hook not in UNRECORDABLE:  # a probe existed: its records say what was lost
        events = [e for e in read_run(run_dir).events if injected in str(e.get("message", ""))]
        assert events and all(
            str(e["message"]).startswith("probe disabled")
            and "nothing recorded on this rank after step" in e["message"]
            for e in events
        )
