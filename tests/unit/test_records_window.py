"""A big run read in bounded memory (records/window.py): the steps that matter in full,
a sample of the rest, and the same top finding (code, ranks, step, tensor) as the run
read whole."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import polars as pl
import pytest

from syncdoctor.doctor.diagnose import diagnose
from syncdoctor.records import cache, reader, window
from syncdoctor.records.reader import read_run

RANKS, STEPS, ONSET, BAD = 4, 3000, 2703, 2
HOUR_AGO_NS = time.time_ns() - 3600 * 10**9


def write_run(root: Path, onset: int | None = ONSET) -> Path:
    """Four ranks; rank BAD runs one backward pass too many at `onset` (a late step),
    and the live check at the next check step reports it, naming the tensor."""
    records = root / "records"
    records.mkdir(parents=True)
    for rank in range(RANKS):
        lines = [
            {
                "v": 1,
                "kind": "snapshot",
                "rank": rank,
                "world_size": RANKS,
                "framework": "torch",
                "host": "node0",
                "env": {"RANK": str(rank)},
                "loss": {"type": "CrossEntropyLoss", "params": {}},
                "optimizer": {"type": "SGD", "param_groups": [{"lr": 0.1}]},
                "tensors": ["a.weight", "b.weight"],
                "init_param_fp": 7,
            }
        ]
        extra = 0
        for step in range(1, STEPS + 1):
            bad = rank == BAD and onset is not None and step >= onset
            extra = 1 if bad else 0
            rec = {
                "v": 1,
                "kind": "step",
                "rank": rank,
                "step": step,
                "micro": 2 if rank == BAD and step == onset else 1,
                "backward": step + extra,
                "opt_steps": step,
                "t": 1000.0 + step,
                "loss": 2.0 * 0.999**step + 0.01 * ((step * 7 + rank) % 5),
                "lr": 0.1,
            }
            if step % 10 == 0 or step == 1:
                rec.update(param_fp=step * 3 + 77 * extra, grad_fp=step * 5, opt_fp=step * 11 + 77 * extra)
            lines.append(rec)
            if onset is not None and step == -(-onset // 10) * 10:
                lines.append(
                    {
                        "v": 1,
                        "kind": "check",
                        "rank": rank,
                        "step": step,
                        "status": "mismatch",
                        "what": ["param"],
                        "ranks": [BAD],
                        "tensor": "b.weight",
                    }
                )
        lines.append({"v": 1, "kind": "end", "rank": rank, "step": STEPS, "t": 5000.0, "status": "ok"})
        path = records / f"rank{rank}.jsonl"
        path.write_text("".join(json.dumps(r, separators=(",", ":")) + "\n" for r in lines))
        os.utime(path, ns=(HOUR_AGO_NS, HOUR_AGO_NS))
    return root


def top(run: Path) -> tuple[str, list[int], int | None, str | None] | None:
    diag = diagnose([run])
    f = diag.findings[0] if diag.findings else None
    return (f.code, f.ranks, f.step, f.tensor) if f else None


@pytest.fixture(autouse=True)
def _cache_on(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(cache.CACHE_ENV, "1")


def test_a_run_over_the_budget_reads_the_steps_that_matter_and_a_sample(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = write_run(tmp_path / "run")
    monkeypatch.setenv(window.FULL_DETAIL_ENV, "2000")
    read = read_run(run)
    assert read.steps.height <= 2000 < RANKS * STEPS
    steps = set(read.steps["step"].to_list())
    # every step around the late fault, the first and the last steps, for every rank
    assert set(range(ONSET - 32, ONSET + 33)) | {1, STEPS} <= steps
    assert read.steps.group_by("step").len()["len"].min() == RANKS
    assert read.steps["rank"].is_sorted() and read.steps.filter(pl.col("rank") == 0)["step"].is_sorted()
    assert read.warnings[-1].startswith(f"a big run ({RANKS * STEPS:,} step records")
    assert f"ranks disagree on param_fp {ONSET // 10 * 10 + 10}" in read.warnings[-1]


def test_the_top_finding_is_the_same_read_whole_or_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run = write_run(tmp_path / "run")
    monkeypatch.setenv(window.FULL_DETAIL_ENV, "0")
    whole = top(run)
    assert whole == ("SD402", [BAD], ONSET, "b.weight")
    monkeypatch.setenv(window.FULL_DETAIL_ENV, "2000")
    assert top(run) == whole


def test_a_healthy_twin_stays_healthy_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run = write_run(tmp_path / "run", onset=None)
    monkeypatch.setenv(window.FULL_DETAIL_ENV, "0")
    whole = diagnose([run])
    monkeypatch.setenv(window.FULL_DETAIL_ENV, "2000")
    bounded = diagnose([run])
    assert [f.code for f in bounded.findings] == [f.code for f in whole.findings]
    assert bounded.verdict == whole.verdict


def test_a_run_under_the_budget_is_read_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run = write_run(tmp_path / "run")
    monkeypatch.delenv(window.FULL_DETAIL_ENV, raising=False)
    read = read_run(run)
    assert read.steps.height == RANKS * STEPS
    assert not any("big run" in w for w in read.warnings)


def test_a_rank_that_stopped_early_keeps_its_last_step(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Many ranks stopping at many steps: the windows cover a few of them, but every
    rank's first and last record are read, so its step count is exact."""
    run = write_run(tmp_path / "run", onset=None)
    for rank, stop in ((1, 1237), (3, 2341)):  # steps off the evenly spaced ones read
        path = run / "records" / f"rank{rank}.jsonl"
        kept = [line for line in path.read_text().splitlines() if json.loads(line).get("step", 0) <= stop]
        path.write_text("\n".join(kept) + "\n")
        os.utime(path, ns=(HOUR_AGO_NS, HOUR_AGO_NS))
    monkeypatch.setattr(window, "MAX_CENTRES", 0)  # no window around those last steps
    monkeypatch.setenv(window.FULL_DETAIL_ENV, "2000")
    read = read_run(run)
    last = dict(read.steps.group_by("rank").agg(pl.col("step").max()).iter_rows())
    assert last == {0: STEPS, 1: 1237, 2: STEPS, 3: 2341}
    # another rank's last step is not read for the ranks that went on
    assert read.steps.filter(pl.col("step").is_in([1237, 2341]))["rank"].to_list() == [1, 3]


def test_a_big_run_killed_mid_write_still_diagnoses(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A rank killed while writing (a torn last line) in a run read bounded: the torn
    record is dropped and said, the fault is still found where it is."""
    run = write_run(tmp_path / "run")
    path = run / "records" / "rank1.jsonl"
    with path.open("a") as fh:
        fh.write('{"v":1,"kind":"step","rank":1,"step":3001,"mic')
    os.utime(path, ns=(HOUR_AGO_NS, HOUR_AGO_NS))
    monkeypatch.setenv(window.FULL_DETAIL_ENV, "2000")
    read = read_run(run)
    assert any("rank1.jsonl: last record truncated" in w for w in read.warnings)
    assert read.steps.filter(pl.col("rank") == 1)["step"].max() == STEPS
    assert top(run) == ("SD402", [BAD], ONSET, "b.weight")


def test_a_big_run_read_batch_by_batch_reads_as_in_one_batch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The triage folds the aggregates of one batch of records at a time (memory for a
    batch, not the run): made while the cache is built, from a few ranks' records at a
    time, and kept in its index, it is the one a pass over the cache's parts makes, a
    part per batch or all in one; a warm read makes no pass, and reads as a read that
    must make one."""
    run = write_run(tmp_path / "run")
    monkeypatch.setenv(window.FULL_DETAIL_ENV, "2000")
    monkeypatch.setattr(reader, "TALLY_ROWS", STEPS + 1)  # a fold every two ranks
    cold = read_run(run)
    meta = json.loads(cache.cache_path(run).read_bytes())
    by_part = window.triage(cache.scan_batches(run, meta, STEPS + 1))
    assert meta["triage"] == by_part.to_json() == window.triage([cache.scan(run, meta)]).to_json()
    assert len(meta["triage"]["centres"]) > 2  # the fault's steps among them, not only the ends
    passes: list[int] = []
    triage = window.triage

    def spy(batches: list[pl.LazyFrame]) -> window.Triage:
        passes.append(len(batches))
        return triage(batches)

    monkeypatch.setattr(window, "triage", spy)
    warm = read_run(run)
    assert passes == []
    meta["triage"] = None  # an index without it: the read makes the pass, a part per batch
    cache.cache_path(run).write_text(json.dumps(meta))
    monkeypatch.setattr(cache, "BATCH_ROWS", STEPS + 1)
    again = read_run(run)
    assert passes == [RANKS]
    for read in (warm, again):
        assert read.steps.equals(cold.steps) and read.warnings == cold.warnings
    assert top(run) == ("SD402", [BAD], ONSET, "b.weight")


def test_batches_are_whole_parts_of_about_the_rows_asked(tmp_path: Path) -> None:
    meta = {
        "parts": "records.x",
        "files": ["0.parquet", "1.parquet", "2.parquet"],
        "counts": [5, 5, 20],
        "columns": [],
        "valued": [],
    }
    assert len(cache.scan_batches(tmp_path, meta, 10)) == 2  # 5 + 5, then the big part alone
    assert len(cache.scan_batches(tmp_path, meta, 1)) == 3
    assert len(cache.scan_batches(tmp_path, meta, 100)) == 1


def test_the_frame_read_from_many_parts_is_one_chunk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A part per rank read as one frame would be a chunk per part (and the rules'
    many queries over it slower, its memory larger): bounded or whole, it is one."""
    run = write_run(tmp_path / "run")
    monkeypatch.setattr(cache, "BATCH_ROWS", STEPS + 1)
    read_run(run)  # cold: the cache's parts written
    monkeypatch.setenv(window.FULL_DETAIL_ENV, "2000")
    assert read_run(run).steps.n_chunks() == 1
    monkeypatch.setenv(window.FULL_DETAIL_ENV, "0")
    assert read_run(run).steps.n_chunks() == 1
