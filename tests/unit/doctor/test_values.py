"""The format-agnostic line reader (ingest/values.py) and rank tags in line headers
(ingest/fields.py): invented lines in the common shapes."""

from __future__ import annotations

import pytest

from syncdoctor.doctor.ingest.fields import strip_prefixes
from syncdoctor.doctor.ingest.values import line_values
from syncdoctor.doctor.must_equal import kind_of


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("it=7 loss=0.5 lr=2.5e-04", {"it": 7, "loss": 0.5, "lr": 2.5e-4}),
        ("Iter 7: loss 0.5, learning rate: 0.01", {"iter": 7, "loss": 0.5, "learning_rate": 0.01}),
        ('{"when": "2025-02-03T04:05:06", "ep": 1, "loss": 0.5}', {"ep": 1, "loss": 0.5}),
        ("{'loss': 0.5, 'lr': 1e-05, 'epoch': 0.25}", {"loss": 0.5, "lr": 1e-5, "epoch": 0.25}),
        ("run:[ 3/ 9], cost is 1.5", {"run": 3, "run_total": 9, "cost": 1.5}),
        ("epoch 003: 12 / 40 gain=3%", {"epoch": 3, "counter": 12, "counter_total": 40, "gain": 3}),
        ("wall 0.25s, rate 14.5it/s, mem 3.2GB", {"wall": 0.25, "rate": 14.5, "mem": 3.2}),
        ("W0203 04:05:06.123 991 loop.cc:88] Loss Scale is low: 1e-30", {"loss_scale_low": 1e-30}),
        ("wrote ckpt/300/model-4.bin at 12:00:01", {}),
    ],
)
def test_line_values(line: str, expected: dict[str, float]) -> None:
    assert line_values(line) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("line", "rank"),
    [
        ("[rank: 3] batch 1 loss=2", 3),
        ("12:00:01 | INFO | [RANK 2] it=4", 2),
        ("2025-02-03 04:05:06 [worker 1] it 4/9 loss 2", 1),
        ("2025-02-03 04:05:06,1 INFO [x.py:12] (1/8) went fine", 1),
        ("go (9/8) ahead", None),
        ("progress (3/10) done", None),
    ],
)
def test_rank_tags(line: str, rank: int | None) -> None:
    assert strip_prefixes(line, False).rank == rank


def test_kinds_by_name() -> None:
    assert kind_of("lr") == kind_of("base_lr") == kind_of("weight_decay") == "optim"
    assert kind_of("loss_scale") == kind_of("grad_scale_small") == "scale"
    assert kind_of("num_updates") == kind_of("epoch") == "counter"
    assert kind_of("loss") is None and kind_of("gnorm") is None


def test_host_labels_peeled_and_ranks_behind_them_read(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from syncdoctor.doctor.ingest import ingest_logs

    lines = []
    for step in range(1, 6):
        for host, rank in (("trn-a-07", 0), ("trn-b-11", 1)):
            lr = 0.5 if rank == 1 and step >= 3 else 0.1
            lines.append(f"{host}: [RANK {rank}] step={step} loss={1.0 / step:.3f} lr={lr}")
    log = tmp_path / "job.out"
    log.write_text("\n".join(lines) + "\n")
    data = ingest_logs([log])
    assert sorted(data.losses["rank"].unique().to_list()) == [0, 1]
    from syncdoctor.doctor.must_equal import partings

    p = partings(data.values)["optim"]
    assert (p.key, p.step, p.values) == ("lr", 3, {0: 0.1, 1: 0.5})


def test_absurd_numbers_never_raise(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Ranks and steps printed as nan, inf or past int64 (found by the fuzz properties)."""
    from syncdoctor.doctor.diagnose import diagnose

    log = tmp_path / "train.log0"
    log.write_text(
        "rank=nan step=1 loss=2\nrank=inf step=2 loss=2\nstep 1e308 loss 1e308\n"
        "[rank0]: Traceback (most recent call last):\nEpoch [-1/1e308] Step [5.8e+16] Loss: 1e308\n"
    )
    diagnose([log])
