"""The shape fast path of the log reader (ingest/shapes.py): it fires on repeated
loss-line shapes and gives exactly what the full path gives; it stays silent on
lines the full path must read (launcher prefixes, rank tags, "\\r" redraws, event
keywords, non-ASCII text, glued records)."""

from __future__ import annotations

import functools
import math
from pathlib import Path

import pytest

from syncdoctor.doctor.ingest import core
from syncdoctor.doctor.ingest.files import LogFile
from syncdoctor.doctor.ingest.scan import iter_chunks
from syncdoctor.doctor.ingest.shapes import build_plan, qualifies


def _plain(i: int) -> list[str]:
    return [
        f"2026-11-29 10:12:{i % 60:02d},123 | rank {i % 4} | epoch 1 | step {i} | loss {2.0 / (i + 1):.6f} | lr 0.05",
        f"epoch: 1 step: {i}, loss is {1.0 / (i + 2):.4f}",
        f"{{'loss': {0.5 + i * 1e-4:.4f}, 'grad_norm': 1.2, 'learning_rate': 5e-05, 'epoch': 0.5}}",
        f"step={i} loss={(i % 7) * 0.1:.4f} lr=1e-{i % 5} grad_norm=0.91",
        f"Epoch [1][{i}/1000]  lr: 1.0e-02, loss: {i % 3}.{i}",
        f"step {i}: 0.{i}",
        f"data loader batch {i} fetched",
    ]


def _unfit(i: int) -> list[str]:
    return [
        f"[rank{i % 4}]: step {i} loss {0.1 * i:.3f}",  # launcher tag
        f"[1,{i % 8}]<stdout>: step {i} loss 0.{i}",  # mpirun tag
        f"[rank: {i % 2}] step {i} loss 0.{i}",  # rank tag in the header
        f" {i}/100 [00:01<00:08, loss=0.{i}]\r {i + 1}/100 [00:01<00:08, loss=0.{i + 1}]",  # redraws
        f"step {i} loss 0.{i} NCCL timeout waiting",  # an event keyword
        f"step {i} 损失 loss 0.{i}",  # non-ASCII
        f"rank 1 step {i} loss 5.9{i}rank 0 step {i} loss 0.6{i}",  # glued records
        f"step={i}, skipped={i // 10} loss 0.{i}",  # DeepSpeed's skip counter
    ]


def _read(path: Path, fast: bool, monkeypatch: pytest.MonkeyPatch) -> tuple[core.LogData, int]:
    # small chunks: the fast path starts with the chunk after a shape's first line
    monkeypatch.setattr(core, "iter_chunks", functools.partial(iter_chunks, chunk_bytes=4096))
    monkeypatch.setattr(core, "FAST_SHAPES", fast)
    counted: list[int] = []
    original = core._FileReader.read

    def read(self: core._FileReader) -> bool:
        done = original(self)
        counted.append(self.fast_lines)
        return done

    monkeypatch.setattr(core._FileReader, "read", read)
    return core.ingest_logs([path]), sum(counted)


def _same(a: core.LogData, b: core.LogData) -> None:
    def norm(rows: list[tuple[object, ...]]) -> list[tuple[object, ...]]:
        return [tuple("nan" if isinstance(v, float) and math.isnan(v) else v for v in r) for r in rows]

    assert norm(a.losses.rows()) == norm(b.losses.rows())
    assert norm(a.values.rows()) == norm(b.values.rows())
    assert [vars(e) for e in a.events] == [vars(e) for e in b.events]
    assert (a.warnings, a.formats, a.n_lines, a.unranked) == (b.warnings, b.formats, b.n_lines, b.unranked)


def test_fires_on_repeated_shapes_with_the_full_paths_rows(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "train_rank0.log"
    path.write_text("\n".join(line for i in range(400) for line in _plain(i)) + "\n")
    full, none = _read(path, False, monkeypatch)
    fast, fired = _read(path, True, monkeypatch)
    assert none == 0
    assert fired > 1500  # all but the first chunk's loss lines
    assert full.losses.height == 400 * 6
    _same(full, fast)


def test_silent_where_the_full_path_must_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "train.log"
    path.write_text("\n".join(line for i in range(400) for line in _unfit(i)) + "\n", encoding="utf-8")
    full, _ = _read(path, False, monkeypatch)
    fast, fired = _read(path, True, monkeypatch)
    assert fired == 0
    assert full.losses.height > 400
    _same(full, fast)


def test_srun_and_host_labels_keep_the_full_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    lines = [f"{i % 4}: step {i} loss 0.{i}" for i in range(3000)]
    path = tmp_path / "srun.log"
    path.write_text("\n".join(lines) + "\n")
    full, _ = _read(path, False, monkeypatch)
    fast, fired = _read(path, True, monkeypatch)
    assert fired == 0
    assert set(full.losses["rank"].to_list()) == {0, 1, 2, 3}
    _same(full, fast)
    host = tmp_path / "hosts.log"
    host.write_text("\n".join(f"gpu-node-{i % 2}: step {i} loss 0.{i}" for i in range(3000)) + "\n")
    full, _ = _read(host, False, monkeypatch)
    fast, fired = _read(host, True, monkeypatch)
    assert fired == 0
    _same(full, fast)


def test_shape_rules() -> None:
    assert qualifies("step 0 loss 0.0", False, False)
    assert not qualifies("[rank0]: step 0 loss 0.0", False, False)
    assert not qualifies("0: step 0 loss 0.0", True, False)
    assert qualifies("0: step 0 loss 0.0", False, False)
    assert not qualifies("gpu-node-0: step 0 loss 0.0", False, True)
    assert not qualifies("[gpu 0] step 0 loss 0.0", False, False)
    assert not qualifies("data 0 fetched", False, False)
    assert not qualifies("loss 0 loss 0", False, False)
    # spans that overlap without being equal cannot each be one group
    assert build_plan("x 0.0", [], [("a", 2, 5), ("b", 4, 5)], False) is None
    plan = build_plan("x 0.0", [], [("a", 2, 5), ("a", 2, 5)], True)
    assert plan is not None and plan.pattern == "^x\\x{20}([0-9]+\\x{2E}[0-9]+)$" and plan.values == (("a", 0),)


def test_reader_counts_nothing_for_an_empty_log(tmp_path: Path) -> None:
    path = tmp_path / "empty.log"
    path.write_text("")
    reader = core._FileReader(LogFile(path, None, None, True), 0, core._EventStore(), [])
    assert reader.read() and reader.fast_lines == 0


def test_lines_a_torchrun_block_takes_after_it_are_skipped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # "rank : N ..." and "time : N ..." lines are loss lines of two shapes (the fast path
    # reads them in bulk) and also field lines of torchrun's failure summary: the block
    # around an "exitcode" line takes the "time" line after it, which the reader then
    # skips, on both paths
    lines = []
    for i in range(600):
        lines.append(f"rank : {i % 4} step {i} loss 0.{i + 1}")
        if i % 10 == 1:  # out of reach of the blocks (6 lines around an exitcode)
            lines.append(f"time : {i % 4} step {i} loss 0.{i + 2}")
        if i % 10 == 9:
            lines += ["exitcode  : 1 (pid: 4242)", f"time : {i % 4} step {i} loss 0.{i + 3}"]
    path = tmp_path / "train.log"
    path.write_text("\n".join(lines) + "\n")
    full, _ = _read(path, False, monkeypatch)
    fast, fired = _read(path, True, monkeypatch)
    assert fired > 500
    assert full.losses.height == 600 + 60  # the 60 "time" lines after an exitcode were taken
    _same(full, fast)


def test_values_cap_keeps_the_first_lines_on_both_paths(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # the fast path merges a chunk's values lines in line order afterwards; where the
    # cap may be reached in a chunk it reads them in file order instead
    monkeypatch.setattr(core, "MAX_VALUE_LINES", 700)
    path = tmp_path / "train_rank0.log"
    path.write_text("\n".join(line for i in range(400) for line in _plain(i)) + "\n")
    full, _ = _read(path, False, monkeypatch)
    fast, fired = _read(path, True, monkeypatch)
    assert fired > 1500
    assert full.values["line"].n_unique() == 700
    assert any("700 lines kept" in w for w in full.warnings)
    _same(full, fast)
