"""What every rank evaluated at the end, compared across ranks (must_equal.final_evaluations),
the trend of the ranks' loss gaps (must_equal.loss_drift), a file's last lines read for
values (ingest/core.py), and the values of a known loss-line shape cut out without a
regex (ingest/values.py): invented lines, firing and silent."""

from __future__ import annotations

import math
import random
from pathlib import Path

import polars as pl
import pytest

from syncdoctor.doctor.ingest import ingest_logs
from syncdoctor.doctor.ingest import values as values_module
from syncdoctor.doctor.ingest.losses import LossParser
from syncdoctor.doctor.ingest.values import line_values
from syncdoctor.doctor.must_equal import final_evaluations, is_evaluation, loss_drift


def _logs(tmp_path: Path, tail: dict[int, list[str]], steps: int = 30) -> list[Path]:
    paths = []
    for rank in (0, 1):
        rng = random.Random(rank)
        lines = [f"step {s} loss {2.0 / s + rng.random() / 50:.4f}" for s in range(1, steps + 1)]
        path = tmp_path / f"worker_{rank}.log"
        path.write_text("\n".join(lines + tail[rank]) + "\n")
        paths.append(path)
    return paths


def test_a_files_last_lines_are_read_for_values_whatever_they_hold(tmp_path: Path) -> None:
    paths = _logs(tmp_path, {0: ["done, val_acc 0.9091"], 1: ["done, val_acc 0.8889"]})
    data = ingest_logs(paths)
    row = data.values.filter(pl.col("key") == "val_acc")
    assert sorted(zip(row["rank"], row["value"], strict=True)) == [(0, 0.9091), (1, 0.8889)]
    parted = final_evaluations(data.values, data.losses)
    assert [p.key for p in parted] == ["val_acc"]
    assert parted[0].values == {0: 0.9091, 1: 0.8889}


@pytest.mark.parametrize(
    "tail",
    [
        {0: ["done, val_acc 0.9091"], 1: ["done, val_acc 0.9091"]},  # equal replicas
        {0: ["done, val_acc 0.9091"], 1: ["done, val_acc 0.9085"]},  # within EVAL_TOL
        {0: ["done, val_acc 0.9091"], 1: ["done"]},  # one rank evaluated
        {0: ["throughput 1200 img/s, last_loss 0.21"], 1: ["throughput 900 img/s, last_loss 0.35"]},  # local
    ],
)
def test_final_evaluations_silent(tmp_path: Path, tail: dict[int, list[str]]) -> None:
    data = ingest_logs(_logs(tmp_path, tail))
    assert final_evaluations(data.values, data.losses) == []


def test_evaluations_by_name() -> None:
    assert all(map(is_evaluation, ("val_acc", "accuracy", "top1", "eval_loss", "test_ppl", "f1")))
    assert not any(map(is_evaluation, ("loss", "train_loss", "lr", "throughput", "grad_norm")))


def _wide(gap: list[float]) -> pl.DataFrame:
    rng = random.Random(3)
    base = [2.3 * math.exp(-s / 30) + 0.1 for s in range(len(gap))]
    r0 = [b * math.exp(rng.gauss(0, 0.05)) for b in base]
    r1 = [b * (1 + g) * math.exp(rng.gauss(0, 0.05)) for b, g in zip(base, gap, strict=True)]
    return pl.DataFrame({"step": list(range(1, len(gap) + 1)), "0": r0, "1": r1})


def test_loss_drift_fires_on_a_gap_that_grows_from_zero() -> None:
    drift = loss_drift(_wide([1.5 * (s / 80) ** 2 for s in range(80)]))
    assert drift is not None and drift.drifting == [0, 1]


@pytest.mark.parametrize(
    "gap",
    [
        [0.0] * 80,  # equal replicas: data noise only
        [0.25] * 80,  # a steady offset from the first step (a loss computed differently)
    ],
)
def test_loss_drift_silent_without_a_trend_from_zero(gap: list[float]) -> None:
    drift = loss_drift(_wide(gap))
    assert drift is not None and drift.drifting == []


@pytest.mark.parametrize(
    "line",
    [
        "2026-01-02 03:04:05 | rank 1 | step 120 | loss 0.3456 | lr 2.5e-04 | scale 65536.0",
        "{'loss': 0.5, 'learning_rate': 1.5e-05, 'epoch': 0.25, 'step': 10}",
        "it 12/400 loss=nan lr=0.1 skipped=3",
    ],
)
def test_values_of_a_known_shape_are_the_regex_values(line: str) -> None:
    parser = LossParser()
    values_module._FAST.clear()
    expected = line_values(line)
    for variant in (line, line.replace("120", "99999").replace("12/", "7/")):
        assert parser.parse(variant)
        slow = line_values(variant)
        line_values(variant, parser.last_shape, parser.last_pos)  # plans the shape
        fast = line_values(variant, parser.last_shape, parser.last_pos)
        assert parser.last_shape in values_module._FAST
        assert fast.keys() == slow.keys() and all(
            (math.isnan(fast[k]) and math.isnan(slow[k])) or fast[k] == slow[k] for k in fast
        )
    assert expected
