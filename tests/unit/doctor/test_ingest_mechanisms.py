"""What real logs say, read as mechanisms: glued per-rank lines, mmcv epoch lines,
the facts inside communicator messages, the order of failures, and `diagnose -`.
Inputs are short lines in the shapes public logs have (see docs/corpus.md)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from syncdoctor.doctor.diagnose import diagnose
from syncdoctor.doctor.ingest import ingest_logs
from syncdoctor.doctor.ingest.losses import split_records
from syncdoctor.doctor.ingest.meaning import (
    duplicate_device,
    loss_scale,
    peer_closed,
    stalled_ranks,
)

CORPUS = Path(__file__).resolve().parents[1] / "corpus" / "cases"
# the entry point as installed (``python -m syncdoctor.cli`` runs the module as
# __main__, whose InputError is not the one the commands raise)
CLI = [sys.executable, "-c", "import sys; from syncdoctor.cli import main; sys.exit(main(sys.argv[1:]))"]


def _top(diag) -> str:
    serious = [f for f in diag.findings if f.severity in ("error", "warning")]
    return serious[0].category if serious else "healthy"


def test_glued_lines_of_two_ranks_are_split_by_rank(tmp_path):
    (tmp_path / "train.log").write_text(
        "rank 1 step 50 loss 5.9896rank 0 step 50 loss 0.6566\n[rank1]: step 51 loss 5.1[rank0]: step 51 loss 0.61\n"
    )
    rows = ingest_logs([tmp_path]).losses.select("rank", "step", "loss").rows()
    assert sorted(rows) == [(0, 50, 0.6566), (0, 51, 0.61), (1, 50, 5.9896), (1, 51, 5.1)]


def test_one_record_with_several_loss_keys_is_not_split():
    line = "Epoch [1][50/100]  lr: 1.0e-02, loss_cls: 0.3, loss_bbox: 0.1, loss: 0.4"
    assert split_records(line) == [line]


def test_mmcv_and_detr_epoch_lines_give_steps(tmp_path):
    (tmp_path / "train.log").write_text(
        "2021-07-14 13:52:26,135 - mmcls - INFO - Epoch [1][10/35]\tlr: 1.000e-02, eta: 0:10:35, loss: 1.4048\n"
        "2021-07-14 13:52:30,150 - mmcls - INFO - Epoch [1][20/35]\tlr: 1.000e-02, eta: 0:08:41, loss: 0.4855\n"
        "Epoch: [0]  [ 10/7393]  eta: 16:41:59  lr: 0.000100  loss: 76.2864 (76.2864)\n"
    )
    data = ingest_logs([tmp_path])
    assert data.losses["step"].to_list()[:2] == [10, 20]
    assert data.losses["epoch"].to_list()[:2] == [1.0, 1.0]


def test_validation_loss_of_megatron_is_not_training_loss(tmp_path):
    (tmp_path / "train.log").write_text(
        " validation loss at iteration 7000 | lm loss value: 7.174200E+00 | lm loss PPL: 1.3E+03 |\n"
    )
    assert ingest_logs([tmp_path]).losses.height == 0


def test_facts_read_from_communicator_messages():
    assert duplicate_device(
        "init.cc:497 NCCL WARN Duplicate GPU detected : rank 6 and rank 0 both on CUDA device 1000"
    ) == (6, 0, "1000")
    assert stalled_ranks("Stalled ops:HorovodBroadcast_dense_1_bias_0 [missing ranks: 1]") == ({1}, set())
    assert stalled_ranks("allreduce.conv1.weight [ready ranks: 5, 1, 4]") == (set(), {1, 4, 5})
    assert peer_closed("node:1:2 [0] NCCL INFO [Service thread] Connection closed by localRank 3") == 3
    assert (
        loss_scale("[deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 64, reducing to 32").scale == 32
    )
    assert loss_scale("Exception: Current loss scale already at minimum - cannot decrease scale anymore.").at_minimum
    assert loss_scale("[Rank 0] step=2000, skipped=1995, lr=[0.001]").skip_counter == (2000, 1995)


def test_loss_scale_warm_up_is_left_alone_and_collapse_is_named(tmp_path):
    warm = "\n".join(
        f"[deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: {2**k}, reducing to {2 ** (k - 1)}"
        for k in range(16, 10, -1)
    )
    (tmp_path / "warm.log").write_text(warm + "\n[Rank 0] step=100, skipped=6, lr=[1e-05]\n")
    assert _top(diagnose([tmp_path / "warm.log"])) == "healthy"
    collapse = "\n".join(
        f"[deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: {2**k}, reducing to {2 ** (k - 1)}"
        for k in range(6, 1, -1)
    )
    (tmp_path / "collapse.log").write_text(collapse + "\n")
    assert _top(diagnose([tmp_path / "collapse.log"])) == "numeric.overflow"


def test_a_peer_that_died_first_is_the_cause_not_the_survivors_timeouts(tmp_path):
    (tmp_path / "job.log").write_text(
        "host:1:2 [0] NCCL INFO [Service thread] Connection closed by localRank 2\n"
        "[rank5]:[E ProcessGroupNCCL.cpp:563] [Rank 5] Watchdog caught collective operation timeout: "
        "WorkNCCL(SeqNum=15734, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600037 milliseconds before timing out.\n"
    )
    assert _top(diagnose([tmp_path / "job.log"])) == "process.crash"


def test_the_watchdogs_sigabrt_is_not_a_crash_of_its_own(tmp_path):
    (tmp_path / "job.log").write_text(
        "[rank1]:[E ProcessGroupNCCL.cpp:1] [Rank 1] Watchdog caught collective operation timeout: "
        "WorkNCCL(SeqNum=9, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600011 milliseconds before timing out.\n"
        "  exitcode  : -6 (pid: 3437)\n"
        "  traceback : Signal 6 (SIGABRT) received by PID 3437\n"
    )
    assert _top(diagnose([tmp_path / "job.log"])) == "comm.fault"


def test_one_sided_work_before_a_timeout_is_control_flow(tmp_path):
    (tmp_path / "job.log").write_text(
        "2026-02-18 10:28:25,496 - root - INFO - Saving latest checkpoint model trained for 3 epochs\n"
        "[rank7]:[E218 10:48:25.033625188 ProcessGroupNCCL.cpp:632] [Rank 7] Watchdog caught collective operation "
        "timeout: WorkNCCL(SeqNum=1512677, OpType=ALLREDUCE, NumelIn=306176, NumelOut=306176, Timeout(ms)=1200000) "
        "ran for 1200027 milliseconds before timing out.\n"
    )
    assert _top(diagnose([tmp_path / "job.log"])) == "sync.control_flow"


def test_a_lone_timeout_stays_a_communication_fault(tmp_path):
    (tmp_path / "job.log").write_text(
        "[rank1]:[E ProcessGroupNCCL.cpp:1] [Rank 1] Watchdog caught collective operation timeout: "
        "WorkNCCL(SeqNum=61, OpType=_ALLGATHER_BASE, NumelIn=7168, NumelOut=14336, Timeout(ms)=1800000) "
        "ran for 1800086 milliseconds before timing out.\n"
    )
    assert _top(diagnose([tmp_path / "job.log"])) == "comm.fault"


def test_diagnose_reads_a_pasted_log_from_standard_input():
    log = (CORPUS / "nccl-dup-gpu-megatron-661.log").read_bytes()
    run = subprocess.run([*CLI, "diagnose", "-", "--json"], input=log, capture_output=True, timeout=120)
    assert run.returncode == 1, run.stderr
    assert b'"category": "env.device"' in run.stdout and b"stdin.log" in run.stdout
    empty = subprocess.run([*CLI, "diagnose", "-"], input=b"", capture_output=True, timeout=120)
    assert empty.returncode == 2 and len(empty.stderr.strip().splitlines()) == 1


def _series_log(tmp_path, values) -> Path:
    path = tmp_path / "train.log"
    path.write_text("".join(f"step {i} loss {v}\n" for i, v in enumerate(values, start=1)))
    return path


def test_a_blow_up_that_came_back_and_still_learns_is_not_a_divergence(tmp_path):
    values = [1.0, 1.0, 1.0, 9.0, 12.0, 6.0] + [0.95 - 0.01 * i for i in range(40)]
    assert not [f for f in diagnose([_series_log(tmp_path, values)]).findings if f.code == "SD101"]


def test_a_blow_up_that_stopped_learning_says_so_without_contradiction(tmp_path):
    values = [1.0, 1.0, 1.0, 9.0, 12.0, 6.0] + [0.93 + 0.001 * (i % 3) for i in range(40)]
    (finding,) = [f for f in diagnose([_series_log(tmp_path, values)]).findings if f.code == "SD101"]
    assert "stopped learning" in finding.evidence[0] and "never" not in finding.evidence[0]
