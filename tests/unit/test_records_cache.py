"""The reader's columnar cache (records/cache.py): taken instead of the JSON lines while
they are unchanged, rebuilt when they change or the cache is damaged, skipped where it
cannot be written; what a run reads as is the same with it, without it, cold or warm."""

from __future__ import annotations

import io
import json
import os
import time
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from syncdoctor.doctor.diagnose import diagnose
from syncdoctor.doctor.report import render_json
from syncdoctor.records import cache, reader, window
from syncdoctor.records.reader import RunRecords, read_run

HOUR_AGO_NS = time.time_ns() - 3600 * 10**9


@pytest.fixture(autouse=True)
def _cache_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """The cache is on by default (records/cache.py); these tests do not depend on
    the environment they run in."""
    monkeypatch.setenv(cache.CACHE_ENV, "1")


def _line(rec: dict[str, Any]) -> str:
    return json.dumps(rec, separators=(",", ":")) + "\n"


def _step(rank: int, step: int, **extra: Any) -> dict[str, Any]:
    return {
        "v": 1,
        "kind": "step",
        "rank": rank,
        "step": step,
        "micro": 1,
        "backward": step,
        "opt_steps": step,
        "t": 1000.0 + step,
        "loss": 2.0 / step + rank * 1e-3,
        "lr": 0.1,
        "param_fp": 5 + step,
        "train_mode": "3/3",
        **extra,
    }


def write_run(root: Path, ranks: int = 2, steps: int = 20, torn: bool = False) -> Path:
    """A finished run: snapshots, steps (one with a NaN loss, rank 1 with a list
    column), a check, an event and an end per rank, dated an hour back. ``torn``:
    rank 0's file ends in half a step record, as a kill mid-write leaves it."""
    records = root / "records"
    records.mkdir(parents=True)
    for rank in range(ranks):
        text = _line(
            {
                "v": 1,
                "kind": "snapshot",
                "rank": rank,
                "world_size": ranks,
                "framework": "torch",
                "host": "node0",
                "env": {"RANK": str(rank)},
                "optimizer": {"type": "SGD", "param_groups": [{"lr": 0.1}]},
            }
        )
        for step in range(1, steps + 1):
            extra: dict[str, Any] = {"tensor_fps": [step, rank]} if rank == 1 else {}
            if step == 7:
                extra.update(loss=None, nonfinite={"loss": "nan"})
            text += _line(_step(rank, step, **extra))
        text += _line({"v": 1, "kind": "check", "rank": rank, "step": steps, "status": "ok", "what": []})
        text += _line({"v": 1, "kind": "event", "rank": rank, "step": 3, "event": "note", "message": "é \u2603"})
        text += _line({"v": 1, "kind": "end", "rank": rank, "step": steps, "t": 2000.0, "status": "ok"})
        if torn and rank == 0:
            text += _line(_step(rank, steps + 1))[:40]
        path = records / f"rank{rank}.jsonl"
        path.write_text(text)
        os.utime(path, ns=(HOUR_AGO_NS, HOUR_AGO_NS))
    return root


def same(a: RunRecords, b: RunRecords) -> bool:
    return (
        a.steps.equals(b.steps)
        and a.steps.schema == b.steps.schema
        and json.dumps([a.snapshots, a.checks, a.events, a.ends, a.warnings, a.ranks])
        == json.dumps([b.snapshots, b.checks, b.events, b.ends, b.warnings, b.ranks])
    )


def rewrite_keeping_stat(path: Path, old: bytes, new: bytes) -> None:
    """Change the file's bytes in place with its size, mtime and inode unchanged: only a
    reader that parses the JSON lines again can see it."""
    assert len(old) == len(new)
    st = path.stat()
    data = path.read_bytes()
    assert data.count(old) == 1
    with path.open("r+b") as fh:
        fh.seek(data.index(old))
        fh.write(new)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert (path.stat().st_size, path.stat().st_mtime_ns, path.stat().st_ino) == (st.st_size, st.st_mtime_ns, st.st_ino)


def test_a_warm_read_takes_the_cache_not_the_json_lines(tmp_path: Path) -> None:
    run = write_run(tmp_path / "run")
    cold = read_run(run)
    assert cache.cache_path(run).is_file()
    # The JSON lines now say another thing, invisibly to size and mtime: the cache
    # still answers (the JSON lines were not parsed), the reader without it does not.
    rewrite_keeping_stat(run / "records" / "rank0.jsonl", b'"step":3,"micro"', b'"step":4,"micro"')
    warm = read_run(run)
    assert same(warm, cold)
    assert warm.steps.filter(pl.col("rank") == 0)["step"].to_list() == list(range(1, 21))
    uncached = read_run(run, use_cache=False)
    assert uncached.steps.filter(pl.col("rank") == 0)["step"].to_list().count(4) == 2


def test_cold_warm_and_no_cache_read_alike(tmp_path: Path) -> None:
    run = write_run(tmp_path / "run")
    none = read_run(run, use_cache=False)
    assert not cache.cache_path(run).exists()  # off means not written either
    cold, warm = read_run(run), read_run(run)
    assert same(none, cold) and same(none, warm)
    assert warm.run_dir == run
    assert {"tensor_fps", "nonfinite"} <= set(warm.steps.columns)
    assert warm.steps.filter((pl.col("rank") == 1) & (pl.col("step") == 7))["loss"].is_nan().all()
    assert warm.steps["rank"].flags["SORTED_ASC"] == none.steps["rank"].flags["SORTED_ASC"]


def test_the_diagnosis_is_the_same_byte_for_byte(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run = write_run(tmp_path / "run")
    monkeypatch.setenv(cache.CACHE_ENV, "0")
    none = render_json(diagnose([run]))
    monkeypatch.setenv(cache.CACHE_ENV, "1")
    cold = render_json(diagnose([run]))
    assert cache.cache_path(run).is_file()
    warm = render_json(diagnose([run]))
    assert none == cold == warm


def test_a_record_file_that_grew_rebuilds_the_cache(tmp_path: Path) -> None:
    run = write_run(tmp_path / "run")
    read_run(run)
    path = run / "records" / "rank1.jsonl"
    with path.open("a") as fh:
        fh.write(_line(_step(1, 21)))
    os.utime(path, ns=(HOUR_AGO_NS, HOUR_AGO_NS))  # same mtime: the size tells
    grown = read_run(run)
    assert grown.steps.filter(pl.col("rank") == 1)["step"].max() == 21
    assert same(grown, read_run(run, use_cache=False))
    # ... and the rebuilt cache is the one the next read takes
    rewrite_keeping_stat(path, b'"step":21,"micro"', b'"step":22,"micro"')
    assert read_run(run).steps.filter(pl.col("rank") == 1)["step"].max() == 21


def test_a_killed_run_reads_with_only_the_torn_record_lost(tmp_path: Path) -> None:
    run = write_run(tmp_path / "run", torn=True)
    none, cold, warm = read_run(run, use_cache=False), read_run(run), read_run(run)
    assert cache.cache_path(run).is_file()
    for got in (none, cold, warm):
        assert got.steps.filter(pl.col("rank") == 0)["step"].to_list() == list(range(1, 21))
        assert got.ends[0]["status"] == "ok" and len(got.checks) == 2
        assert any("last record truncated" in w for w in got.warnings)
    assert same(none, warm)
    assert render_json(diagnose([run])) == render_json(diagnose([run]))


def test_a_truncated_or_foreign_cache_is_ignored_and_rebuilt(tmp_path: Path) -> None:
    run = write_run(tmp_path / "run")
    good = read_run(run)
    path = cache.cache_path(run)
    whole = path.read_bytes()
    path.write_bytes(whole[: len(whole) // 2])  # a writer killed half way (were it not atomic)
    assert same(read_run(run), good)
    assert path.read_bytes() != whole[: len(whole) // 2]  # rewritten
    pl.DataFrame({"rank": [0]}).write_parquet(path)  # a Parquet file, but not ours
    assert same(read_run(run), good)


def test_a_folder_that_cannot_be_written_is_read_without_a_cache(tmp_path: Path) -> None:
    run = write_run(tmp_path / "run")
    (run / ".syncdoctor").write_text("")  # a file where the cache's folder would go: mkdir fails
    first, second = read_run(run), read_run(run)
    assert same(first, read_run(run, use_cache=False)) and same(first, second)
    assert not list(run.rglob("*.parquet*"))  # no cache, no temporary left behind


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0, reason="root writes into read-only folders")
def test_a_read_only_run_folder_is_read_without_a_cache(tmp_path: Path) -> None:
    run = write_run(tmp_path / "run")
    run.chmod(0o555)
    try:
        assert same(read_run(run), read_run(run, use_cache=False))
        assert not cache.cache_path(run).exists()
    finally:
        run.chmod(0o755)


def test_files_just_written_or_with_a_tail_are_not_cached(tmp_path: Path) -> None:
    run = write_run(tmp_path / "run")
    path = run / "records" / "rank0.jsonl"
    os.utime(path)  # now: a second write within the clock's tick could keep size and mtime
    read_run(run)
    assert not cache.cache_path(run).exists()
    os.utime(path, ns=(HOUR_AGO_NS, HOUR_AGO_NS))
    (run / "records" / "rank0.123.0.tail").write_bytes(b"")  # a rank running, or killed
    read_run(run)
    assert not cache.cache_path(run).exists()


def test_a_run_without_step_records_reads_alike_from_the_cache(tmp_path: Path) -> None:
    run = write_run(tmp_path / "run", steps=0)
    none, cold, warm = read_run(run, use_cache=False), read_run(run), read_run(run)
    assert cache.cache_path(run).is_file()
    assert none.steps.height == 0 and same(none, cold) and same(none, warm)


def test_the_cache_is_on_unless_turned_off(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """On by default; SYNCDOCTOR_RECORDS_CACHE=0 writes nothing beside the run."""
    run = write_run(tmp_path / "run")
    monkeypatch.setenv(cache.CACHE_ENV, "0")
    read_run(run)
    assert not cache.cache_path(run).exists()
    monkeypatch.delenv(cache.CACHE_ENV)
    read_run(run)
    assert cache.cache_path(run).is_file()


def test_the_cache_is_built_one_rank_file_at_a_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A cold read parses each rank's step records alone (never the whole run's at
    once) and streams them into the cache, reading the same as without it; the
    scratch parts are gone afterwards."""
    run = write_run(tmp_path / "run", ranks=3, torn=True)
    none = read_run(run, use_cache=False)

    def whole_run(*_: Any) -> pl.DataFrame:
        raise AssertionError("the whole run's step records parsed at once")

    monkeypatch.setattr(reader, "_parse_steps", whole_run)
    cold = read_run(run)
    assert cache.cache_path(run).is_file() and same(none, cold)
    # the index and the one folder of parts it names: no scratch left, no merged copy
    parts = json.loads(cache.cache_path(run).read_text())["parts"]
    assert sorted(p.name for p in cache.cache_path(run).parent.iterdir()) == sorted([cache.CACHE_FILE, parts])
    assert sorted(p.name for p in (cache.cache_path(run).parent / parts).iterdir()) == [
        "0.parquet",
        "1.parquet",
        "2.parquet",
    ]
    assert same(none, read_run(run))


@pytest.mark.parametrize(
    ("old", "new"),
    [
        (b'"rank":1,"step":5,', b'"rank":0,"step":5,'),  # a step record of another rank
        (b'"rank":1,"step":5,', b'"rank":1,"step":4,'),  # a step twice
        (b'"rank":1,"step":5,"micro":1', b'"rank":1,"step":5,"micro":x'),  # a value of another type
    ],
)
def test_what_a_rank_alone_could_read_differently_is_read_as_before(tmp_path: Path, old: bytes, new: bytes) -> None:
    """Where one rank's step records parsed alone could differ from the run parsed
    together (their order once sorted, a corrupt line), the cache is built from the
    whole run as before: the same records either way."""
    run = write_run(tmp_path / "run")
    path = run / "records" / "rank1.jsonl"
    rewrite_keeping_stat(path, old, new)
    none, cold, warm = read_run(run, use_cache=False), read_run(run), read_run(run)
    assert same(none, cold) and same(none, warm)


def _parts(run: Path) -> Path:
    return cache.cache_path(run).parent / json.loads(cache.cache_path(run).read_text())["parts"]


def test_a_rebuilt_cache_replaces_the_old_parts_and_scratch_of_a_killed_build(tmp_path: Path) -> None:
    """The index names one folder of parts; a rebuild leaves only the new one, and the
    scratch folder of a conversion whose process is gone (killed) is removed too; a
    format-1 cache file is removed."""
    run = write_run(tmp_path / "run")
    read_run(run)
    old = _parts(run)
    folder = cache.cache_path(run).parent
    dead = folder / ".parts.999999999.abc"  # no such process
    dead.mkdir()
    (dead / "0.parquet").write_bytes(b"half")
    os.utime(dead, ns=(HOUR_AGO_NS, HOUR_AGO_NS))
    recent = folder / ".parts.999999999.def"  # gone too, but written to a moment ago: left
    recent.mkdir()
    (folder / "records.parquet").write_bytes(b"format 1")
    path = run / "records" / "rank0.jsonl"
    with path.open("a") as fh:
        fh.write(_line(_step(0, 21)))
    os.utime(path, ns=(HOUR_AGO_NS, HOUR_AGO_NS))
    grown = read_run(run)
    assert grown.steps.filter(pl.col("rank") == 0)["step"].max() == 21
    assert _parts(run) != old and not old.exists() and not dead.exists() and recent.exists()
    assert sorted(p.name for p in folder.iterdir()) == sorted([cache.CACHE_FILE, _parts(run).name, recent.name])


def test_a_damaged_or_missing_part_is_not_trusted(tmp_path: Path) -> None:
    run = write_run(tmp_path / "run", ranks=3)
    good = read_run(run)
    part = _parts(run) / "1.parquet"
    whole = part.read_bytes()
    part.write_bytes(whole[: len(whole) // 2])
    assert same(read_run(run), good)  # read from the JSON lines, the cache rebuilt
    (_parts(run) / "2.parquet").unlink()
    assert same(read_run(run), good)
    # a part that lost rows but is still a Parquet file of the right columns
    pl.read_parquet(_parts(run) / "0.parquet").head(3).write_parquet(_parts(run) / "0.parquet")
    assert same(read_run(run), good)


def test_ranks_converted_side_by_side_keep_the_order_of_a_whole_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rank files are converted by several threads: the other records, the warnings
    and the rows still come in rank order, as the whole run read in memory has them."""
    run = write_run(tmp_path / "run", ranks=9, torn=True)
    for rank in (2, 5, 8):  # more warnings, from ranks far apart
        path = run / "records" / f"rank{rank}.jsonl"
        with path.open("a") as fh:
            fh.write(f"not json {rank}\n")
        os.utime(path, ns=(HOUR_AGO_NS, HOUR_AGO_NS))
    monkeypatch.setattr(reader, "CONVERT_THREADS", 4)
    none, cold, warm = read_run(run, use_cache=False), read_run(run), read_run(run)
    assert len([w for w in none.warnings if "unreadable lines" in w]) == 3
    assert same(none, cold) and same(none, warm)
    assert len(list(_parts(run).iterdir())) == 9


def test_a_rank_file_with_its_steps_out_of_order_is_converted_sorted(tmp_path: Path) -> None:
    """A rank's steps out of order (but each once) are sorted as the whole run's are,
    and still converted rank by rank (not the fallback that reads the run whole)."""
    run = write_run(tmp_path / "run")
    path = run / "records" / "rank1.jsonl"
    lines = path.read_text().splitlines(keepends=True)
    steps = [n for n, line in enumerate(lines) if '"kind":"step"' in line]
    a, b = steps[3], steps[10]
    lines[a], lines[b] = lines[b], lines[a]
    path.write_text("".join(lines))
    os.utime(path, ns=(HOUR_AGO_NS, HOUR_AGO_NS))
    none = read_run(run, use_cache=False)
    cold = read_run(run)
    assert same(none, cold) and same(none, read_run(run))
    assert len(list(_parts(run).iterdir())) == 2  # one part per rank: converted rank by rank


def test_nested_columns_are_read_where_some_step_record_has_the_key(tmp_path: Path) -> None:
    """A list or struct column is in the frame where some rank's step record has its key
    (even null), absent where none has: the same cold, warm and without the cache."""
    run = write_run(tmp_path / "run")  # rank 1 writes tensor_fps; step 7 nonfinite
    path = run / "records" / "rank0.jsonl"
    text = path.read_text().replace('"step":4,"micro":1', '"step":4,"acts":null,"micro":1')  # a key, null
    path.write_text(text.replace('"step":3,"micro":1', '"ids":[3],"micro":1'))  # in a record without a step
    os.utime(path, ns=(HOUR_AGO_NS, HOUR_AGO_NS))
    for got in (read_run(run, use_cache=False), read_run(run), read_run(run)):
        nested = {c for c in got.steps.columns if c in reader._NESTED}
        assert nested == {"tensor_fps", "nonfinite", "ids", "acts"}


def test_a_key_first_written_late_in_a_long_run_is_read(tmp_path: Path) -> None:
    """The reader parses step records with the keys some record has (records/reader.py:
    those of the first lines, then a search for the rest): a scalar key and a nested one
    that first appear far past the first lines are read, and the frame is the one a parse
    with every column of the schema gives."""
    steps = 3 * reader._SAMPLE_LINES
    late = {2 * reader._SAMPLE_LINES: {"reduce_ratio": 0.5}, steps - 1: {"ids": [4, 2]}}
    blob = "".join(_line(_step(0, step, **late.get(step, {}))) for step in range(1, steps + 1)).encode()
    got = reader._read_steps(blob)
    assert got.filter(pl.col("step") == 2 * reader._SAMPLE_LINES)["reduce_ratio"].to_list() == [0.5]
    assert got.filter(pl.col("step") == steps - 1)["ids"].to_list() == [[4, 2]]
    whole = pl.read_ndjson(io.BytesIO(blob), schema=reader.STEP_SCHEMA, ignore_errors=True).select(got.columns)
    assert got.equals(whole, null_equal=True) and got.schema == whole.schema
    assert "tensor_fps" not in got.columns and "loss_scale" in got.columns  # nested absent; scalar null


def test_the_cache_reads_only_the_columns_that_hold_a_value(tmp_path: Path) -> None:
    """Columns null in every row are not written to a rank's Parquet part nor read from
    the parts (the index names the others) and come back as nulls: the frame is the one
    read without the cache."""
    run = write_run(tmp_path / "run")
    cold = read_run(run)
    meta = json.loads(cache.cache_path(run).read_bytes())
    assert "loss" in meta["valued"] and "tensor_fps" in meta["valued"]
    assert "loss_scale" in meta["columns"] and "loss_scale" not in meta["valued"]
    # each part holds the columns with a value in its own rows (rank 0 writes no tensor_fps)
    assert "loss_scale" not in pl.read_parquet_schema(_parts(run) / "0.parquet")
    assert "tensor_fps" not in pl.read_parquet_schema(_parts(run) / "0.parquet")
    assert "tensor_fps" in pl.read_parquet_schema(_parts(run) / "1.parquet")
    warm, none = read_run(run), read_run(run, use_cache=False)
    assert cold.steps.equals(none.steps, null_equal=True) and warm.steps.equals(none.steps, null_equal=True)
    assert warm.steps.schema == none.steps.schema


def test_a_run_read_whole_is_kept_a_part_per_rank_with_its_triage(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run the reader must parse whole (here a step twice) is kept as a conversion
    keeps one, a part per rank with the triage of a bounded read, so that its later
    reads go through it a batch of ranks at a time like any other run's."""
    run = write_run(tmp_path / "run", ranks=3)
    rewrite_keeping_stat(run / "records" / "rank1.jsonl", b'"rank":1,"step":5,', b'"rank":1,"step":4,')
    none, cold = read_run(run, use_cache=False), read_run(run)
    assert same(none, cold)
    meta = json.loads(cache.cache_path(run).read_bytes())
    assert meta["files"] == ["0.parquet", "1.parquet", "2.parquet"]
    assert meta["triage"] == window.triage(cache.scan_batches(run, meta, 1)).to_json()
    monkeypatch.setenv(window.FULL_DETAIL_ENV, "30")  # under the run's 60 step records: bounded
    bounded = read_run(run)
    assert bounded.warnings[-1].startswith("a big run (60 step records of 3 ranks")
    assert bounded.steps.group_by("rank").agg(pl.col("step").max())["step"].to_list() == [20, 20, 20]
