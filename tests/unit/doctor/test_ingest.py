"""Raw-log ingestion: loss formats, ranks, global steps, events."""

from __future__ import annotations

import math
from pathlib import Path

import polars as pl
import pytest

from syncdoctor.doctor.ingest import EVENT_KINDS, LOSS_SCHEMA, ingest_logs
from syncdoctor.doctor.ingest.events import classify
from syncdoctor.doctor.ingest.files import rank_from_path
from syncdoctor.doctor.ingest.losses import LossParser, parse_loss_line

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "logs"
PLAYBOOK = [0.25, 0.34, 0.49, 0.28, 0.52, 0.81, 0.96, 0.67, 1.12, 1.56]


def _series(data, source_part: str, rank: int | None = None) -> pl.DataFrame:
    df = data.losses.filter(pl.col("source").str.contains(source_part, literal=True))
    if rank is not None:
        df = df.filter(pl.col("rank") == rank)
    return df.sort("line")


def _same(a: float | None, b: float | None) -> bool:
    if a is None or b is None:
        return a is b
    return (math.isnan(a) and math.isnan(b)) or a == pytest.approx(b)


# --- one line, one format ------------------------------------------------------------------------

LINES = [
    # line, step, loss, epoch, lr, grad_norm
    ("step 10 loss 0.25", 10, 0.25, None, None, None),
    ("step=10 loss=0.25", 10, 0.25, None, None, None),
    ("Epoch [1/4] Step [10] Loss: 0.25", 10, 0.25, 1.0, None, None),
    ("Epoch [2/4] Step [10/500] Loss: 0.25", 10, 0.25, 2.0, None, None),
    ("epoch: 1 step: 10, loss is 0.25", 10, 0.25, 1.0, None, None),
    (
        "epoch: 1 step: 10, loss is Tensor(shape=[], dtype=Float32, value= 0.25)",
        10,
        0.25,
        1.0,
        None,
        None,
    ),
    (
        "{'loss': 0.25, 'grad_norm': 1.2, 'learning_rate': 5e-05, 'epoch': 0.5}",
        None,
        0.25,
        0.5,
        5e-05,
        1.2,
    ),
    ('{"step": 7, "loss": 0.25, "lr": 0.001}', 7, 0.25, None, 0.001, None),
    (
        "Epoch 1:  12%|#2        | 12/100 [00:01<00:08, 10.50it/s, loss=0.25]",
        12,
        0.25,
        1.0,
        None,
        None,
    ),
    (
        "2026-11-29 10:12:01,123 | rank 0 | epoch 1 | step 10 | loss 0.251300 | lr 0.050000 | grad_norm 1.2345",
        10,
        0.2513,
        1.0,
        0.05,
        1.2345,
    ),
    ("step 3 loss nan", 3, math.nan, None, None, None),
    ("step 3 loss: inf", 3, math.inf, None, None, None),
    ("step=3 loss=-inf lr=0.1", 3, -math.inf, None, 0.1, None),
    ("Iter 40/1000, loss: 0.22, acc: 0.91, lr: 2e-4", 40, 0.22, None, 2e-4, None),
    (
        "step 90 loss tensor(0.2100, device='cuda:0', grad_fn=<NllLossBackward0>)",
        90,
        0.21,
        None,
        None,
        None,
    ),
    (
        " iteration      100/  500000 | learning rate: 1.500E-04 | lm loss: 7.634E+00 | loss scale: 65536.0 | grad norm: 2.345 |",
        100,
        7.634,
        None,
        1.5e-4,
        2.345,
    ),
    ("rank=1 step=4 loss=0.3011 grad_norm=[0.1, 0.2, 0.3]", 4, 0.3011, None, None, None),
    ("train loss 0.4 at global step 12", 12, 0.4, None, None, None),
    ("step 3: 0.49", 3, 0.49, None, None, None),
    ("Epoch 3 loss is 0.25.", None, 0.25, 3.0, None, None),
    # more frameworks seen in public issue trackers
    (
        "Epoch 0:  45%|####5     | 450/1000 [01:23<01:42,  5.38it/s, loss=0.231, v_num=0, train_loss_step=0.225]",
        450,
        0.231,
        0.0,
        None,
        None,
    ),  # PyTorch Lightning
    (
        "2024/01/01 10:00:00 - mmengine - INFO - Epoch(train)  [2][ 50/500]  lr: 1.0000e-02  eta: 0:10:00  "
        "time: 0.5  memory: 3000  loss: 1.2345  loss_cls: 0.5  grad_norm: 3.1",
        50,
        1.2345,
        2.0,
        0.01,
        3.1,
    ),
    (
        "| epoch 001 | loss 7.123 | nll_loss 6.9 | ppl 120 | num_updates 100 | lr 0.0005 | gnorm 1.2 |",
        100,
        7.123,
        1.0,
        0.0005,
        1.2,
    ),  # fairseq
    (
        '{"epoch": 1, "update": 1.5, "loss": "7.1", "lr": "0.0005"}',
        1,
        7.1,
        1.0,
        0.0005,
        None,
    ),  # fairseq json
    (
        "{ Epoch:[  1/  2], step:[    3/  100], loss: 10.123, per_step_time: 1234ms, lr: 1e-05, "
        "overflow cond: False, loss_scale: 1.0, global_norm: [1.23]",
        3,
        10.123,
        1.0,
        1e-05,
        1.23,
    ),  # MindFormers
    (
        "[Train][Epoch 1/120][Iter: 10/500]lr(LinearWarmup): 0.001, top1: 0.01, CELoss: 6.90, loss: 6.90",
        10,
        6.9,
        1.0,
        None,
        None,
    ),  # PaddleClas
    (
        "[01/01 10:00:00 d2.utils.events]:  eta: 1:00:00  iter: 19  total_loss: 2.345  loss_cls: 1.1  lr: 0.0002",
        19,
        2.345,
        None,
        0.0002,
        None,
    ),  # detectron2
    ("iter 100: loss 2.3456, time 123.45ms, mfu 12.30%", 100, 2.3456, None, None, None),  # nanoGPT
    (
        "step:  10  loss:  7.1234  memory: 30.5GiB(40%)  tps: 1234",
        10,
        7.1234,
        None,
        None,
        None,
    ),  # torchtitan
]


@pytest.mark.parametrize(("line", "step", "loss", "epoch", "lr", "grad_norm"), LINES)
def test_loss_line_formats(line, step, loss, epoch, lr, grad_norm):
    (point,) = parse_loss_line(line)
    assert point.step == step
    assert _same(point.loss, loss)
    assert _same(point.epoch, epoch)
    assert _same(point.lr, lr)
    assert _same(point.grad_norm, grad_norm)


@pytest.mark.parametrize(
    "line",
    [
        "{'eval_loss': 2.05, 'eval_runtime': 3.2, 'epoch': 0.2}",
        "Validation: epoch 1 loss 0.3100",
        "{'train_runtime': 200.0, 'train_loss': 2.2, 'epoch': 0.3}",
        "[WARNING] Loss shows abnormal fluctuation: from 0.25 to 1.56 within 10 steps",
        "epoch time: 45123.678 ms, per step time: 9024.736 ms",
        "loss_scale: 65536.0 step 3",
        "Step 10: 100%|##########| 10/10",
    ],
)
def test_lines_that_are_not_training_loss(line):
    assert parse_loss_line(line) == []


def _comparable(points) -> list[tuple]:
    return [tuple("nan" if isinstance(v, float) and math.isnan(v) else v for v in vars(p).values()) for p in points]


def test_shape_memo_reads_the_same_numbers_as_a_fresh_scan():
    parser = LossParser()
    lines = [line for line, *_ in LINES] + [
        "step 123456 loss 0.0001 lr 1e-10",
        "step 1 loss 12345.678 lr 1",
        "epoch: 10 step: 1000, loss is Tensor(shape=[], dtype=Float32, value= 123.5)",
        "Epoch [12/40] Step [1234/5000] Loss: 10.25",
    ]
    for line in lines * 2:  # the second pass reads through the memo
        assert _comparable(parser.parse(line)) == _comparable(parse_loss_line(line)), line


def test_playbook_series_one_line_and_one_per_line():
    one_line = " ".join(f"step {i}: {v}" for i, v in enumerate(PLAYBOOK, 1))
    assert [p.loss for p in parse_loss_line(one_line)] == PLAYBOOK
    data = ingest_logs([FIXTURES / "playbook_series.log"])
    assert data.losses["loss"].to_list() == PLAYBOOK
    assert data.losses["step"].to_list() == list(range(1, 11))
    assert data.formats[str(FIXTURES / "playbook_series.log")] == "step_colon"


# --- files and folders -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def all_logs():
    return ingest_logs([FIXTURES])


def test_schema_and_files(all_logs):
    assert dict(all_logs.losses.schema) == LOSS_SCHEMA
    assert len(all_logs.files) == len(all_logs.formats) > 10
    assert all(e.kind in EVENT_KINDS for e in all_logs.events)


def test_mindspore_lossmonitor_per_epoch_steps_become_global(all_logs):
    for rank in (0, 1):
        df = _series(all_logs, f"train.log{rank}", rank)
        assert df["step"].to_list() == list(range(1, 11))
        assert df["epoch"].to_list() == [1.0] * 5 + [2.0] * 5
    rank1 = _series(all_logs, "train.log1", 1)
    assert math.isnan(rank1["loss"][8])  # "value= nan" kept
    assert rank1["loss"][7] == pytest.approx(1.44213)  # loss-scale tuple: the loss is the first tensor
    assert all_logs.formats[str(FIXTURES / "mindspore_lossmonitor" / "train.log0")] == "mindspore_lossmonitor"


def test_hf_trainer_steps_by_order_and_eval_skipped(all_logs):
    df = _series(all_logs, "hf_trainer.log")
    assert df["step"].to_list() == [1, 2, 3]
    assert df["loss"][:2].to_list() == [2.3012, 2.1] and math.isnan(df["loss"][2])
    assert df["lr"].to_list() == [4.9e-05, 4.8e-05, 4.7e-05]
    assert df["rank"].null_count() == 3


def test_progress_bar_counter_restarts_per_epoch(all_logs):
    df = _series(all_logs, "tqdm_progress.log")
    assert df["step"].to_list() == list(range(1, 9))
    assert df["loss"].to_list() == pytest.approx([1.9, 1.8, 1.7, 1.6, 0.9, 0.8, 0.7, 0.6])


@pytest.mark.parametrize(
    ("name", "steps"),
    [
        ("lab_combined.log", [10, 20]),
        ("mpirun_tagged.log", [10, 20]),
        ("srun_label.log", [1, 2, 3]),
        ("torchrun_tee.log", [1, 2, 3, 4, 5, 6]),
        ("nccl_debug.log", [100, 101]),
    ],
)
def test_combined_multi_rank_files(all_logs, name, steps):
    for rank in (0, 1):
        assert _series(all_logs, name, rank)["step"].to_list() == steps
    assert _series(all_logs, name)["rank"].null_count() == 0


def test_lab_format_nan_and_inf(all_logs):
    row = _series(all_logs, "lab_combined.log", 1).row(1, named=True)
    assert math.isnan(row["loss"]) and row["grad_norm"] == math.inf


def test_torchrun_log_dir_ranks(all_logs):
    for rank, n in ((0, 4), (1, 3)):
        df = _series(all_logs, f"attempt_0/{rank}/stdout.log")
        assert df["rank"].to_list() == [rank] * n


@pytest.mark.parametrize(
    ("path", "rank"),
    [
        ("logs/train.log0", 0),
        ("logs/train.log12", 12),
        ("train_log_1.txt", 1),
        ("msrun_log/worker_0.log", 0),
        ("rank1.log", 1),
        ("log_rank_3.txt", 3),
        ("torchelastic/run/attempt_0/2/stdout.log", 2),
        ("torchelastic/run/attempt_1/5/stderr.log", 5),
        ("job/device3/train.log", 3),
        ("node1_rank7.log", 7),
        ("log_output/1/rank.4/stdout", 4),
        ("msrun_log/scheduler.log", None),
        ("train.log", None),
        ("train.log.1", None),  # logrotate's numbering, not a rank
        ("plog/plog-12345_20261129.log", None),
    ],
)
def test_rank_from_file_name(path, rank):
    assert rank_from_path(Path(path)) == rank


def test_rank_from_file_name_end_to_end(tmp_path):
    names = [
        "train.log0",
        "train_log_1.txt",
        "worker_2.log",
        "rank3.log",
        "log_rank_4.txt",
        "node1_rank5.log",
        "device6/train.log",
        "attempt_0/7/stdout.log",
    ]
    for i, name in enumerate(names):
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"step 1 loss 0.{i}\n")
    data = ingest_logs([tmp_path])
    got = {Path(s).relative_to(tmp_path).as_posix(): r for s, r in data.losses.select("source", "rank").rows()}
    assert got == {name: i for i, name in enumerate(names)}
    assert not data.warnings


def test_probe_run_folder_reads_logs_not_records(tmp_path):
    (tmp_path / "records").mkdir()
    (tmp_path / "records" / "rank0.jsonl").write_text('{"v":1,"kind":"step","loss":0.5}\n')
    (tmp_path / "train.log").write_text("step 1 loss 0.5\nstep 2 loss 0.4\n")
    data = ingest_logs([tmp_path])
    assert data.files == [str(tmp_path / "train.log")]
    assert data.losses.height == 2


# --- events ------------------------------------------------------------------------------------

EVENT_LINES = [
    # line, kind, benign
    (
        # msrun's scheduler while the cluster forms: EAGAIN, "try again" (a healthy MindSpore 2.10 run here)
        "[WARNING] DISTRIBUTED(32575,7f1c696a06c0,python):2026-12-01-05:09:11.118.012 "
        "[mindspore/ccsrc/cluster/rpc/tcp/connection.cc:79] SocketEventHandler] Event value fd: 10, events: 1, "
        "state: 4, errcode: 11, errno: 11 Resource temporarily unavailable, remote peer: 1",
        "network",
        True,
    ),
    (
        # the same call failing for real stays a network fault
        "[ERROR] DISTRIBUTED(32575,7f1c696a06c0,python):2026-12-01-05:09:11.118.012 "
        "[mindspore/ccsrc/cluster/rpc/tcp/connection.cc:79] SocketEventHandler] Event value fd: 10, events: 8, "
        "state: 4, errcode: 104, errno: 104 Connection reset by peer, remote peer: 1",
        "network",
        False,
    ),
    (
        "[rank1]:[E1129 10:12:01.123456 1 ProcessGroupNCCL.cpp:616] [Rank 1] Watchdog caught collective operation timeout: "
        "WorkNCCL(SeqNum=12, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600000 milliseconds before timing out.",
        "watchdog",
        False,
    ),
    (
        "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer [127.0.0.1]:12345",
        "network",
        False,
    ),
    (
        "RuntimeError: [/gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting 30000ms for recv operation to complete",
        "timeout",
        False,
    ),
    (
        "RuntimeError: Detected mismatch between collectives on ranks. Rank 0 is running collective: CollectiveFingerPrint(...)",
        "mismatch",
        False,
    ),
    (
        "RuntimeError: Expected to have finished reduction in the prior iteration before starting a new one.",
        "mismatch",
        False,
    ),
    (
        "node1:12:34 [0] transport/net_ib.cc:1295 NCCL WARN NET/IB : Got completion from peer 10.0.0.1<4503> with error 12",
        "network",
        False,
    ),
    # NCCL's proxy thread: the local peer process went away (it ended first)
    ("node1:12:34 [0] NCCL WARN Connection closed by localRank 1", "exit", False),
    ("node1:12:34 [0] NCCL INFO [Service thread] Connection closed by localRank 2", "exit", False),
    (
        "node1:1:2 [0] init.cc:497 NCCL WARN Duplicate GPU detected : rank 6 and rank 0 both on CUDA device 1000",
        "configuration",
        False,
    ),
    (
        "node1:5021:5386 [0] transport/net_ib.cc:93 NCCL WARN NET/IB : Got async event : client reregistration",
        "network",
        True,
    ),
    ("[1,0]<stderr>:Stalled ops:HorovodBroadcast_dense_1_bias_0 [missing ranks: 1]", "mismatch", False),
    ("Parameter indices which did not receive grad for rank 3: 444 445", "mismatch", False),
    (
        "[INFO] [loss_scaler.py:181:update_scale] [deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 64, reducing to 32",
        "overflow",
        False,
    ),
    (
        "Exception: Current loss scale already at minimum - cannot decrease scale anymore. Exiting run.",
        "overflow",
        False,
    ),
    (
        "EJ0001: 2024-05-21-11:57:54.167.645 Failed to initialize the HCCP process. Reason: Maybe the last training process is running.",
        "configuration",
        False,
    ),
    ("  ran for 721595 milliseconds before timing out", "timeout", False),
    (
        "node1:12:34 [0] NCCL INFO comm 0x55d1c0a0 rank 0 nranks 8 cudaDev 0 busId 1b000 - Init COMPLETE",
        "info",
        True,
    ),
    ("node1:12:34 [0] NCCL INFO Channel 00/02 :    0   1", None, False),
    (
        "node1:12:34 [0] NCCL INFO Call to connect returned Connection refused, retrying",
        "retry",
        False,
    ),
    (
        "torch.distributed.DistBackendError: NCCL error in: NCCLUtils.hpp:275, unhandled system error, NCCL version 2.18.1",
        "network",
        False,
    ),
    (
        "[ERROR] HCCL(1,python):2026-11-29-10:05:00.123.456 [hccl_socket_manager.cc:778] wait socket establish timeout, role[1] rank[1] timeout[120]",
        "timeout",
        False,
    ),
    (
        "EI0002: [PID: 1] 2026-11-29-10:35:00.100.000 The wait execution of the Notify register times out.",
        "timeout",
        False,
    ),
    (
        "EJ0001: [PID: 1] 2026-11-29-10:04:59.500.000 Failed to initialize the HCCP process.",
        "network",
        False,
    ),
    ("EI0006: [PID: 1] 2026-11-29-10:05:02.000.000 Getting socket times out.", "timeout", False),
    (
        "[ERROR] HCCL(1,python):2026-11-29 [hcom.cc:500] hcom_allreduce failed, tag[AllReduce_group_1], ret[7]",
        "network",
        False,
    ),
    (
        "[ERROR] HCCL(1,python):2026-11-29 [hccl.cc:10] connect timeout, please check HCCL_CONNECT_TIMEOUT",
        "timeout",
        False,
    ),
    (
        "[ERROR] HCCL(1,python):2026-11-29 [hccl_impl.cc:300] execute timeout, HCCL_EXEC_TIMEOUT[1800]",
        "timeout",
        False,
    ),
    (
        "[WARNING] HCCL(1,python):2026-11-29 [transport.cc:200] connect retry 3/10 to remote rank[5]",
        "retry",
        False,
    ),
    (
        "[ERROR] RUNTIME(1,python):2026-11-29 [device.cc:100] Device 1 is busy, device already in use by process 999",
        "configuration",
        False,
    ),
    (
        "[WARNING] DISTRIBUTED(1,f,python):2026-11-29-10:00:00.100.000 [cluster_context.cc:255] BuildCluster] Topology build timed out., retry(3/120).",
        "retry",
        True,
    ),
    (
        "[ERROR] DISTRIBUTED(1,f,python):2026-11-29 [cluster_context.cc:153] Finalize] Node 0 is timed out, the cluster will exit.",
        "timeout",
        False,
    ),
    ("RuntimeError: Launch kernel failed: Default/AllReduce-op0", "crash", False),
    (
        "[WARNING] ME(1:2,MainProcess):2026-11-29 [_api.py:318] There's worker exits with exception, kill all other workers.",
        "exit",
        False,
    ),
    (
        "[ERROR] ME(1:2,MainProcess):2026-11-29 [_api.py:268] Worker process 2002 exit with exception.",
        "exit",
        False,
    ),
    (
        "[ERROR] ME(1:2,MainProcess):2026-11-29 Distributed Communication has failed. Please check the network.",
        "network",
        False,
    ),
    ("MemoryError", "oom", False),
    ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB.", "oom", False),
    (
        "RuntimeError: [enforce fail at alloc_cpu.cpp:114] data. DefaultCPUAllocator: can't allocate memory: you tried to allocate 4 bytes",
        "oom",
        False,
    ),
    ("RuntimeError: DataLoader worker (pid 1234) is killed by signal: Killed.", "crash", False),
    ("  traceback : Signal 9 (SIGKILL) received by PID 4002", "crash", False),
    ("ValueError: too many values to unpack (expected 2)", "crash", False),
    ("torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ", "exit", False),
    (
        "E1129 10:30:05.123000 1 torch/distributed/elastic/multiprocessing/api.py:869] failed (exitcode: -9) local_rank: 1 (pid: 4002) of binary: /usr/bin/python3",
        "exit",
        False,
    ),
    (
        "mpirun noticed that process rank 1 with PID 0 on node node-a exited on signal 9 (Killed).",
        "crash",
        False,
    ),
    ("srun: error: node-3: task 1: Exited with exit code 1", "exit", False),
    (
        "[ERROR] GRADIENT_SYNC: Rank 0 and Rank 1 parameter gradient mismatch at step 1200",
        "mismatch",
        False,
    ),
    ("[WARNING] Loss shows abnormal fluctuation: from 0.25 to 1.56 within 10 steps", "info", False),
    (
        "Waiting in store based barrier to initialize process group for rank: 0, key: store_based_barrier_key:1 (world_size=2, timeout=0:30:00)",
        None,
        False,
    ),
    ("    raise RuntimeError('Timed out')", None, False),
    (
        "torch.distributed.DistBackendError: [3] is setting up NCCL communicator and retrieving ncclUniqueId from [0] via c10d "
        "key-value store by key '0', but store->get('0') got error: Socket Timeout",
        "timeout",
        False,
    ),
    (
        "RuntimeError: The server socket has failed to bind to [::]:29500 (errno: 98 - Address already in use).",
        "configuration",
        False,
    ),
    ("RuntimeError: CUDA error: an illegal memory access was encountered", "crash", False),
    (
        "[ERROR] DEVICE(1,f,python):2026-11-29 [memory_manager.cc:1] Malloc for kernel output failed, Memory isn't enough",
        "oom",
        False,
    ),
    ("EL0004: [PID: 1] 2026-11-29-10:00:00 Failed to allocate memory.", "oom", False),
    (
        # the rendezvous store cannot be reached at all: the launch's address/port
        "[E socket.cpp:957] [c10d] The client socket has timed out after 1800s while trying to connect to (10.0.0.1, 29500).",
        "configuration",
        False,
    ),
    ("ncclCommInitRank failed.", "network", False),
]


@pytest.mark.parametrize(("line", "kind", "benign"), EVENT_LINES)
def test_event_kinds(line, kind, benign):
    match = classify(line, line.lower())
    got = match.rule.kind if match else None
    assert got == kind
    if kind is not None:
        assert match.rule.benign is benign


def test_every_kind_is_found_in_the_fixtures(all_logs):
    assert {e.kind for e in all_logs.events} == set(EVENT_KINDS)


def _events(data, part: str):
    return [e for e in data.events if part in e.source]


def test_msrun_first_failure_is_found_by_time_not_by_the_scheduler():
    data = ingest_logs([FIXTURES / "msrun"])
    topo = [e for e in data.events if "Topology build timed out" in e.raw]
    assert len(topo) == 3 and all(e.benign and e.kind == "retry" for e in topo)
    failures = sorted((e for e in data.events if not e.benign and e.t is not None), key=lambda e: e.t)
    first = failures[0]
    assert (first.kind, first.rank, first.step) == ("oom", 1, 2)
    # the scheduler names node 0, which msrun killed afterwards
    named = [e for e in _events(data, "scheduler.log") if e.kind == "timeout"]
    assert named and all(e.t > first.t and e.rank is None for e in named)
    assert {e.kind for e in _events(data, "msrun_console.txt")} >= {"exit", "timeout"}


def test_torchrun_failure_block():
    data = ingest_logs([FIXTURES / "torchrun"])
    block = [e for e in data.events if e.raw.startswith("time: ")]
    assert len(block) == 1
    b = block[0]
    assert (b.kind, b.rank, b.host) == ("exit", 1, "gpu-node-7")
    assert "exitcode: -9" in b.raw and "SIGKILL" in b.raw and b.t is not None
    # the block's traceback field is part of the block, not a second event
    assert not any("received by PID" in e.raw for e in data.events if e is not b)
    watchdog = [e for e in data.events if e.kind == "watchdog"]
    assert watchdog and all(e.rank == 0 and e.t is not None for e in watchdog)
    agent = [e for e in data.events if "failed (exitcode" in e.raw]
    assert agent[0].rank == 1


def test_nccl_debug_events(all_logs):
    events = _events(all_logs, "nccl_debug.log")
    info = [e for e in events if e.kind == "info"]
    assert info and all(e.benign for e in info)
    assert {e.host for e in events if "NCCL WARN" in e.raw} == {"gpu-node-1", "gpu-node-2"}
    assert any(e.kind == "retry" for e in events)
    assert not any("Channel 00/02" in e.raw for e in events)
    wd = [e for e in events if e.kind == "watchdog"]
    assert wd[0].rank == 1 and wd[0].step == 101


def test_hccl_plog_events_keep_time_and_order(all_logs):
    events = _events(all_logs, "plog-12345")
    kinds = [e.kind for e in events]
    assert kinds == [
        "configuration",  # EJ0001 whose reason is an NPU still held by the last process
        "timeout",
        "network",
        "retry",
        "timeout",
        "network",
        "timeout",
        "timeout",
        "configuration",
    ]
    assert [e.line for e in events] == sorted(e.line for e in events)
    assert all(e.t is not None for e in events)


def test_playbook_lines_align_to_last_step(all_logs):
    events = _events(all_logs, "playbook_errors.log")
    assert [(e.kind, e.step) for e in events] == [("mismatch", 1190), ("info", 1190)]


def test_event_step_aligned_by_time_across_files(tmp_path):
    (tmp_path / "train.log").write_text(
        "2026-11-29 10:00:00,000 | rank 1 | step 10 | loss 0.5\n"
        "2026-11-29 10:00:10,000 | rank 1 | step 20 | loss 0.4\n"
        "2026-11-29 10:00:20,000 | rank 1 | step 30 | loss 1.9\n"
    )
    (tmp_path / "plog-1.log").write_text(
        "[ERROR] 2026-11-29-10:00:12 (PID:1, Device:1, RankID:1) hccl fftsplus task timeout occurred\n"
    )
    data = ingest_logs([tmp_path])
    (event,) = data.events
    assert (event.kind, event.rank, event.step) == ("timeout", 1, 20)


def test_event_flood_is_capped_with_a_count(tmp_path):
    lines = [f"node1:1:2 [0] NCCL INFO Call to connect returned Connection refused, retrying {i}" for i in range(1000)]
    (tmp_path / "rank0.log").write_text("\n".join(lines) + "\n")
    data = ingest_logs([tmp_path])
    assert 200 <= len(data.events) <= 300
    assert data.events[-1].line == 1000  # the end of a run is kept
    assert any("more retry events of rank 0" in w for w in data.warnings)
