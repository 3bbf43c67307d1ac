"""Size: a 100 MB single line, 1,024 rank files in one folder, missing ranks and
mixed world sizes, all through the whole diagnosis. (Ingest-level checks of long
lines and missing ranks are in tests/unit/doctor/test_ingest_robust.py; the 5 GB stream
is benchmarks/bench_bigfile.py.)"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from syncdoctor.cli import main
from syncdoctor.doctor.diagnose import diagnose

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "fuzz"))
from corpus import synthetic_records  # noqa: E402

LINE_BYTES = 100 * 1000 * 1000


def _write_run(root: Path, world: int, ranks: range | list[int], steps: int = 12) -> None:
    (root / "records").mkdir(parents=True, exist_ok=True)
    files = synthetic_records(world=world, steps=steps)
    for rank in ranks:
        (root / "records" / f"rank{rank}.jsonl").write_bytes(files[rank])


def test_100mb_single_line_is_cut_and_reported(tmp_path, capsys):
    log = tmp_path / "train.log0"
    with open(log, "wb") as f:
        f.writelines(b"step %d loss %.3f\n" % (s, 2.0 / s) for s in range(1, 31))
        f.write(b'{"dump": "')
        chunk = b"x" * (1 << 20)
        for _ in range(-(-LINE_BYTES // len(chunk))):  # streamed: never 100 MB in this process
            f.write(chunk)
        f.write(b' loss 9.9"}\n')
        f.writelines(b"step %d loss %.3f\n" % (s, 2.0 / s) for s in range(31, 61))
    assert log.stat().st_size > LINE_BYTES
    t0 = time.perf_counter()
    code = main(["diagnose", str(tmp_path), "--json"])
    elapsed = time.perf_counter() - t0
    out, err = capsys.readouterr()
    assert code in (0, 1), err
    assert "Traceback" not in out + err
    assert "train.log0:31: line longer than 1 MiB; only its start was read" in out
    diag = diagnose([tmp_path])
    assert diag.ranks[0].steps == 60  # the lines after the long one are read too
    assert elapsed < 60, f"{elapsed:.1f} s"


def test_1024_rank_files_in_one_folder(tmp_path):
    world = 1024
    _write_run(tmp_path, world, range(world), steps=6)
    for rank in range(world):
        (tmp_path / f"train.log{rank}").write_text(
            "".join(f"step {s} loss {2.0 / s + 0.001 * rank:.4f}\n" for s in range(1, 7))
        )
    diag = diagnose([tmp_path])
    assert [r.rank for r in diag.ranks] == list(range(world))
    assert {r.status for r in diag.ranks} == {"ok"}
    assert not [w for w in diag.warnings if "no record file" in w or "no loss lines" in w]
    assert len(diag.sources) == world + 1  # every log, and the records folder
    assert diag.verdict == "healthy", diag.findings


def test_1024_log_files_without_records(tmp_path):
    for rank in range(1024):
        (tmp_path / f"train.log{rank}").write_text(f"step 1 loss 0.5\nstep 2 loss 0.{rank % 10}\n")
    diag = diagnose([tmp_path])
    assert [r.rank for r in diag.ranks] == list(range(1024))
    assert len(diag.sources) == 1024


def test_missing_ranks_give_a_warning_and_a_partial_report(tmp_path):
    _write_run(tmp_path, world=8, ranks=[0, 1, 2, 3, 5])
    diag = diagnose([tmp_path])
    assert "no record file for ranks [4, 6, 7] of world size 8" in diag.warnings
    status = {r.rank: r.status for r in diag.ranks}
    assert status == {0: "ok", 1: "ok", 2: "ok", 3: "ok", 4: "missing", 5: "ok", 6: "missing", 7: "missing"}
    assert diag.verdict != "inconclusive" or diag.findings is not None


def test_mixed_world_sizes_take_the_largest_and_warn(tmp_path):
    _write_run(tmp_path, world=2, ranks=[0, 1])
    four = synthetic_records(world=4)
    (tmp_path / "records" / "rank3.jsonl").write_bytes(four[3])
    diag = diagnose([tmp_path])
    assert any("no record file for ranks [2] of world size 4" in w for w in diag.warnings)
    assert [r.rank for r in diag.ranks] == [0, 1, 2, 3]


def test_one_stray_high_rank_does_not_blow_up_the_report(tmp_path):
    for rank in (0, 1, 99999):  # logs only: with records, their world size would win
        (tmp_path / f"rank{rank}.log").write_text("step 1 loss 0.5\n")
    t0 = time.perf_counter()
    diag = diagnose([tmp_path])
    assert time.perf_counter() - t0 < 30
    assert [r.rank for r in diag.ranks] == [0, 1, 99999]
    assert any("99997 of 100000 ranks left no records or loss lines" in w for w in diag.warnings)
