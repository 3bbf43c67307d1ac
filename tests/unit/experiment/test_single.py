"""The single-rank baseline's rewrite of each launcher command (no process started)."""

from __future__ import annotations

import pytest

from syncdoctor.experiment.single import single_rank, with_lab_out


@pytest.mark.parametrize(
    ("command", "expected", "world"),
    [
        (
            "torchrun --nproc_per_node 4 --nnodes 2 --node_rank 1 --master_addr 10.0.0.1 --master_port 29500 "
            "train.py --lr 0.1 --nproc_per_node 9",
            "torchrun --standalone --nproc_per_node 1 --nnodes 1 train.py --lr 0.1 --nproc_per_node 9",
            8,
        ),
        (
            "python -m torch.distributed.run --nproc-per-node=8 --rdzv-endpoint=h:1 --rdzv-backend c10d train.py",
            "python -m torch.distributed.run --standalone --nproc-per-node=1 train.py",
            8,
        ),
        (
            "accelerate launch --multi_gpu --num_processes 2 --main_process_port 1234 train.py --x 1",
            "accelerate launch --num_processes 1 train.py --x 1",
            2,
        ),
        (
            "/venv/bin/syncdoctor lab run init-mismatch --world-size 4 --steps 60",
            "/venv/bin/syncdoctor lab run init-mismatch --world-size 1 --steps 60",
            4,
        ),
        (
            "python -m syncdoctor.cli lab run clean --steps 30",
            "python -m syncdoctor.cli lab run --world-size 1 clean --steps 30",
            2,
        ),
        (
            "msrun --worker_num 8 --local_worker_num 8 --master_port 8118 --join True train.py",
            "msrun --worker_num 1 --local_worker_num 1 --join True train.py",
            8,
        ),
        (
            "mpirun -np 4 -H a,b --oversubscribe python train.py -n 3",
            "mpirun -np 1 --oversubscribe python train.py -n 3",
            4,
        ),
        (
            "deepspeed --num_gpus 8 --num_nodes 2 --hostfile hosts train.py --deepspeed ds.json",
            "deepspeed --num_gpus 1 --num_nodes 1 train.py --deepspeed ds.json",
            16,
        ),
    ],
)
def test_launchers_are_rewritten_to_one_process(command: str, expected: str, world: int) -> None:
    single = single_rank(command.split())
    assert single.command == expected.split(), single
    assert single.world_size == world


@pytest.mark.parametrize(
    ("command", "why"),
    [
        ("python train.py", "cannot tell how this launcher sets the number of processes"),
        ("bash run_all.sh 8", "cannot tell how this launcher sets the number of processes"),
        ("torchrun --nproc_per_node 1 train.py", "already starts one process"),
        ("torchrun --nproc_per_node gpu train.py", "not a number"),
        ("msrun train.py", "--worker_num not given"),
    ],
)
def test_what_cannot_be_rewritten_says_why(command: str, why: str) -> None:
    single = single_rank(command.split())
    assert single.command is None and why in single.why


def test_a_lab_command_gets_the_variant_folder_as_its_out() -> None:
    cmd = ["syncdoctor", "lab", "run", "clean", "--out", "old", "--steps", "3"]
    assert with_lab_out(cmd, "/x/control") == [
        "syncdoctor",
        "lab",
        "run",
        "clean",
        "--steps",
        "3",
        "--out",
        "/x/control",
    ]
    assert with_lab_out(["torchrun", "t.py", "--out", "o"], "/x") == ["torchrun", "t.py", "--out", "o"]
