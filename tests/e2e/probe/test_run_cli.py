"""`syncdoctor run -- CMD`: zero-code attach through a generated sitecustomize, per-rank
logs, the command's own exit code, and a folder `syncdoctor diagnose` reads."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from syncdoctor.lab.launch import free_port
from syncdoctor.records import read_run

SCRIPTS = Path(__file__).parent / "scripts"
SYNCDOCTOR = [sys.executable, "-c", "import sys; from syncdoctor.cli import main; sys.exit(main())"]
RUN_TIMEOUT_S = 240


def syncdoctor_run(out: Path, *command: str, extra: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo")
    return subprocess.run(
        [*SYNCDOCTOR, "run", "--out", str(out), *extra, "--", *command],
        env=env,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        stdin=subprocess.DEVNULL,
    )


def test_exit_code_pythonpath_and_an_existing_sitecustomize_are_kept(tmp_path: Path) -> None:
    own = tmp_path / "own"
    own.mkdir()
    (own / "sitecustomize.py").write_text("import os\nos.environ['OWN_SITECUSTOMIZE'] = 'ran'\n")
    env = dict(os.environ, PYTHONPATH=str(own))
    code = "import os, sys; print(os.environ.get('OWN_SITECUSTOMIZE'), 'torch' in sys.modules); sys.exit(7)"
    proc = subprocess.run(
        [*SYNCDOCTOR, "run", "--out", str(tmp_path / "run"), "--", sys.executable, "-c", code],
        env=env,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
    )
    assert proc.returncode == 7
    assert proc.stdout.strip() == "ran False"  # the user's sitecustomize ran; torch was not imported for it
    assert (tmp_path / "run" / "run.json").exists()


def test_missing_command_and_reused_folder(tmp_path: Path) -> None:
    assert syncdoctor_run(tmp_path / "a", "no-such-command-xyz").returncode == 127
    records = tmp_path / "b" / "records"
    records.mkdir(parents=True)
    (records / "rank0.jsonl").write_text("")
    proc = syncdoctor_run(tmp_path / "b", sys.executable, "-c", "pass")
    assert proc.returncode == 2 and "already holds" in proc.stderr


def _check_run(out: Path, world_size: int, steps: int) -> None:
    run = read_run(out)
    assert sorted(run.ranks) == list(range(world_size))
    for rank in range(world_size):
        assert run.steps.filter(run.steps["rank"] == rank)["step"].to_list() == list(range(1, steps + 1))
        snap = run.snapshots[rank]
        assert snap["auto"] is True and snap["loss"]["type"] == "CrossEntropyLoss"
        assert snap["loader"]["sampler"] == "DistributedSampler" and snap["global_batch"] == 16 * world_size
        assert snap["ddp"]["wrapper"] == "DistributedDataParallel" and "init_param_fp_local" in snap
        log = (out / "logs" / f"rank{rank}.log").read_text()
        assert f"rank {rank} step {steps} loss" in log and f"rank {rank} done" in log
    assert run.steps["loss"].null_count() == 0
    # The input is hashed at every check step, and between them while that is cheap (< 0.2%).
    checked = run.steps.filter(run.steps["param_fp"].is_not_null())
    assert checked.height and checked["data_fp"].null_count() == 0
    assert run.steps["grad_norm_local"].drop_nulls().len() > 0
    assert not [c for c in run.checks if c["status"] != "ok"] and run.checks
    assert set(run.ends) == set(range(world_size))


def torchrun_syncdoctor(
    out: Path, script: str, *args: str, nproc: int = 2, extra: tuple[str, ...] = ()
) -> subprocess.CompletedProcess[str]:
    """`syncdoctor run [extra] -- torchrun --nproc-per-node N scripts/SCRIPT ARGS` on loopback."""
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc)]
    where = ["--master-addr", "127.0.0.1", "--master-port", str(free_port())]
    return syncdoctor_run(out, *torchrun, *where, str(SCRIPTS / script), *args, extra=extra)


@pytest.mark.slow
def test_torchrun_script_unmodified(tmp_path: Path) -> None:
    out = tmp_path / "run"
    proc = torchrun_syncdoctor(out, "ddp_train.py", "--steps", "12")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "rank 1 step 12 loss" in proc.stdout  # the ranks' output still reaches the terminal
    _check_run(out, 2, 12)
    from syncdoctor.cli import main

    assert main(["diagnose", str(out), "--json"]) == 0


@pytest.mark.slow
def test_script_spawning_its_own_ranks_with_its_own_comm_hook_and_exit_code(tmp_path: Path) -> None:
    out = tmp_path / "run"
    proc = syncdoctor_run(
        out,
        sys.executable,
        str(SCRIPTS / "spawn_train.py"),
        str(free_port()),
        "--steps",
        "12",
        "--comm-hook",
        "--exit-code",
        "5",
        extra=("--check-every", "1"),
    )
    assert proc.returncode == 5, proc.stderr[-3000:]
    _check_run(out, 2, 12)
    run = read_run(out)
    # K = 1: every step's parameters are compared; the run is shorter than one block, so rank 0
    # reads all 12 checks at the end and writes one ok record for them.
    ok = [c for c in run.checks if c["status"] == "ok"]
    assert [(c["rank"], c["detail"]["first_step"], c["step"], c["detail"]["checks"]) for c in ok] == [(0, 1, 12, 12)]
    assert run.steps["param_fp"].null_count() == 0
    # The script's own hook is untouched: the pre-reduce norm is measured at the detailed steps
    # (step 1, then every DETAIL_EVERY-th).
    measured = run.steps.filter(run.steps["grad_norm_local"].is_not_null())
    assert sorted(measured["step"].to_list()) == [1, 1]


@pytest.mark.slow
def test_hand_written_all_reduce_with_grad_scaler(tmp_path: Path) -> None:
    """No DDP: the probe attaches at the first optimizer step, finds the model, reads
    the loss scale from the GradScaler and records the step it skipped on overflow."""
    out = tmp_path / "run"
    env_prefix = ["env", "RANK=0", "WORLD_SIZE=1", "MASTER_ADDR=127.0.0.1", f"MASTER_PORT={free_port()}"]
    proc = syncdoctor_run(out, *env_prefix, sys.executable, str(SCRIPTS / "amp_plain.py"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = read_run(out)
    steps = run.steps.sort("step")
    assert steps["step"].to_list() == list(range(1, 9))
    assert steps["loss_scale"].to_list()[:3] == [1024.0, 1024.0, 1024.0]
    assert steps["overflow"].to_list()[2] is True and steps["opt_steps"].to_list()[2] == 2
    assert steps["micro"].to_list() == [1] * 8
    assert abs(steps["loss"].to_list()[0] - float(proc.stdout.split("loss ")[1].split()[0])) < 1e-3
    snap = run.snapshots[0]
    assert snap["tensors"] == ["0.weight", "0.bias", "2.weight", "2.bias"]  # the module was found
    assert snap["optimizer"]["type"] == "Adam" and snap["loss"]["type"] == "MSELoss"
