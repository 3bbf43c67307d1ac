"""`syncdoctor export --tensorboard DIR RUN`: every rank's series as TensorBoard
scalars, checked by reading the event files back (TFRecord framing, Event protos)."""

from __future__ import annotations

import struct
import sys
from collections import defaultdict
from pathlib import Path

import pytest

from syncdoctor.cli import main

pytest.importorskip("tensorboardX")
from tensorboardX.proto import event_pb2  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "fixtures" / "report"))
from report_runs import write_run  # noqa: E402


def read_scalars(logdir: Path) -> dict[str, dict[int, float]]:
    """tag → {step: value} from every event file under ``logdir``."""
    out: dict[str, dict[int, float]] = defaultdict(dict)
    files = sorted(logdir.glob("events.out.tfevents.*"))
    assert files, f"no event file in {logdir}"
    for path in files:
        data = path.read_bytes()
        pos = 0
        while pos < len(data):
            (length,) = struct.unpack("<Q", data[pos : pos + 8])
            event = event_pb2.Event()
            event.ParseFromString(data[pos + 12 : pos + 12 + length])
            pos += 12 + length + 4  # length, its crc, the record, its crc
            for value in event.summary.value:
                out[value.tag][event.step] = value.simple_value
    return out


def test_export_writes_every_rank_and_step(tmp_path, capsys):
    run = write_run(tmp_path / "run", world=3, steps=120, check_every=10, left_out=(2,), onset=40)
    out = tmp_path / "tb"
    assert main(["export", "--tensorboard", str(out), str(run)]) == 0
    assert "for 3 ranks" in capsys.readouterr().out
    assert sorted(p.name for p in out.iterdir()) == ["rank0", "rank1", "rank2", "replicas"]
    from syncdoctor.doctor.diagnose import load_evidence

    ev = load_evidence([run])
    for rank in range(3):
        scalars = read_scalars(out / f"rank{rank}")
        losses = ev.losses.filter(ev.losses["rank"] == rank)
        assert sorted(scalars["loss"]) == list(range(1, 121))  # every step, not a downsampled series
        assert scalars["loss"][77] == pytest.approx(losses.filter(losses["step"] == 77)["loss"][0], rel=1e-6)
        assert sorted(scalars["grad_norm/local"]) == [1, 100]
        assert scalars["lr"][5] == pytest.approx(0.1)
    local = {r: read_scalars(out / f"rank{r}")["grad_norm/local"][100] for r in range(3)}
    assert len(set(local.values())) == 3  # each rank its own norm
    parted = read_scalars(out / "replicas")["replicas/parted_ranks"]
    assert parted[30] == 0 and parted[40] == 1 and parted[120] == 1


def test_export_of_nothing_is_a_one_line_error(tmp_path, capsys):
    assert main(["export", "--tensorboard", str(tmp_path / "tb"), str(tmp_path / "missing")]) == 2
    assert capsys.readouterr().err.strip().count("\n") == 0
