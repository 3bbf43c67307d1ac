"""The every-step records' memory-mapped tail (records/tail.py): what a killed rank
leaves there is read back exactly once, a half-written entry never, and the lines
it gives are the ones the writer would have written."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from syncdoctor.records import read_run
from syncdoctor.records.tail import SLOT, TAIL_SLOTS, read_tail
from syncdoctor.records.writer import RecordWriter

KILLED_WRITER = """
import os, signal, sys
from syncdoctor.records.writer import RecordWriter
writer = RecordWriter(sys.argv[1], 3, tail=True)
writer.write("snapshot", rank=3, world_size=4)
for step in range(1, int(sys.argv[2]) + 1):
    writer.step(step, 1, step, step, 1000.0 + step / 1000, 1.0 / step, 0.1)  # 1 ms steps
    if step == int(sys.argv[3]):
        writer.write("check", rank=3, step=step, status="ok", what=[], ranks=[], tensor=None, detail={})
os.kill(os.getpid(), signal.SIGKILL)
"""


def _killed_writer(run_dir: Path, steps: int, check_at: int) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", KILLED_WRITER, str(run_dir), str(steps), str(check_at)], capture_output=True, check=False
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr


@pytest.mark.parametrize(
    ("steps", "check_at"), [(10, 4), (TAIL_SLOTS + 7, 0)], ids=["after-a-check", "past-a-full-tail"]
)
def test_a_killed_writer_loses_no_step(tmp_path: Path, steps: int, check_at: int) -> None:
    _killed_writer(tmp_path, steps, check_at)
    in_file = [
        json.loads(line)["step"]
        for line in (tmp_path / "records" / "rank3.jsonl").read_text().splitlines()
        if '"kind":"step"' in line
    ]
    assert len(in_file) == (check_at or TAIL_SLOTS)  # the rest were only in the tail when the process died
    run = read_run(tmp_path)
    assert run.steps["step"].to_list() == list(range(1, steps + 1))
    assert run.steps["loss"].to_list() == [1.0 / s for s in range(1, steps + 1)]  # exact: %.17g
    assert any("not yet in the file" in w for w in run.warnings)


def test_slow_steps_reach_the_file_within_seconds(tmp_path: Path) -> None:
    writer = RecordWriter(tmp_path, 0, tail=True)
    for step, t in enumerate([100.0, 101.0, 102.5, 103.0], 1):  # the third is 2.5 s after the first waiting
        writer.step(step, 1, step, step, t, 0.5, 0.1)
    lines = (tmp_path / "records" / "rank0.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == [1, 2, 3]
    writer.close()


def test_tail_lines_match_the_general_writer(tmp_path: Path) -> None:
    """NaN, infinity and a missing loss or lr read as the general path writes them."""
    fast, slow = RecordWriter(tmp_path / "fast", 0, tail=True), RecordWriter(tmp_path / "slow", 0)
    cases = [(2.5, 0.1), (float("nan"), 0.1), (float("-inf"), None), (None, 0.1), (0.0, 0.0)]
    for step, (loss, lr) in enumerate(cases, 1):
        fast.step(step, 1, step, step, 5.0, loss, lr)
        slow.write("step", rank=0, step=step, micro=1, backward=step, opt_steps=step, t=5.0, loss=loss, lr=lr)
    fast.close()
    slow.close()
    for name in ("fast", "slow"):
        assert not list((tmp_path / name / "records").glob("*.tail"))  # a closed writer leaves none
    read = [
        [json.loads(line) for line in (tmp_path / name / "records" / "rank0.jsonl").read_text().splitlines()]
        for name in ("fast", "slow")
    ]
    assert read[0] == read[1]
    assert read[0][1]["loss"] is None and read[0][1]["nonfinite"] == {"loss": "nan"}


def test_a_half_written_entry_is_not_read_and_a_written_step_is_taken_once(tmp_path: Path) -> None:
    writer = RecordWriter(tmp_path, 0, tail=True)
    for step in (1, 2, 3):
        writer.step(step, 1, step, step, 10.0 + step, 0.5, 0.1)
    tail = writer._tail
    assert tail is not None
    written = tail.lines()
    os.write(writer._fd, written.split(b"\n", 1)[0] + b"\n")  # step 1 reached the file, the tail not yet told
    tail._body(tail._map, 32 + 3 * SLOT + 8, 4, 1, 4, 4, 14.0, 0.5, 0.1, 0)  # step 4: no seq yet
    rank, lines = read_tail(tail.path)
    assert rank == 0 and lines == written.splitlines(keepends=True)
    run = read_run(tmp_path)
    assert run.steps["step"].to_list() == [1, 2, 3]


def test_junk_tail_files_are_named_and_skipped(tmp_path: Path) -> None:
    writer = RecordWriter(tmp_path, 0)
    writer.write("step", rank=0, step=1, loss=1.0)
    writer.close()
    (tmp_path / "records" / "rank0.1.0.tail").write_bytes(b"\x00junk" * 40)
    (tmp_path / "records" / "rank0.2.0.tail").write_bytes(b"SDT")
    run = read_run(tmp_path)
    assert run.steps["step"].to_list() == [1]
    assert sum("not read" in w for w in run.warnings) == 2


def test_a_forked_child_writes_nothing(tmp_path: Path) -> None:
    writer = RecordWriter(tmp_path, 0, tail=True)
    writer.step(1, 1, 1, 1, 1.0, 0.5, 0.1)
    pid = os.fork()
    if pid == 0:  # a data-loader worker, say: it must neither flush nor remove the parent's tail
        writer.write("event", rank=0, step=1, event="x")
        writer.close()
        os._exit(0)
    os.waitpid(pid, 0)
    assert (tmp_path / "records" / "rank0.jsonl").read_text() == ""
    assert writer._tail is not None and writer._tail.path.exists()
    writer.close()
    assert [json.loads(line)["step"] for line in (tmp_path / "records" / "rank0.jsonl").read_text().splitlines()] == [1]
