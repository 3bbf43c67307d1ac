"""Bad input never breaks ingestion: it becomes warnings, and only "nothing at all
could be read" is an error."""

from __future__ import annotations

import gzip
import io
import os
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from syncdoctor.doctor.ingest import ingest_logs, scan
from syncdoctor.doctor.ingest.scan import MAX_LINE_BYTES, TolerantStream, _split_lines, iter_chunks
from syncdoctor.errors import InputError


def test_nothing_to_read_is_an_input_error(tmp_path):
    with pytest.raises(InputError, match="no log files"):
        ingest_logs([tmp_path])
    with pytest.raises(InputError):
        ingest_logs([tmp_path / "missing.log"])
    with pytest.raises(InputError):
        ingest_logs([])


def test_missing_path_among_good_ones_is_a_warning(tmp_path):
    good = tmp_path / "train.log"
    good.write_text("step 1 loss 0.5\n")
    data = ingest_logs([good, tmp_path / "missing.log"])
    assert data.losses.height == 1
    assert any("missing.log: no such file" in w for w in data.warnings)


def test_empty_file_is_a_warning(tmp_path):
    (tmp_path / "train.log").write_bytes(b"")
    data = ingest_logs([tmp_path / "train.log"])
    assert data.losses.is_empty() and data.events == []
    assert any("empty file" in w for w in data.warnings)


def test_binary_files_in_a_folder_are_skipped(tmp_path):
    (tmp_path / "worker_0.log").write_text("step 1 loss 0.5\n")
    (tmp_path / "core.dump.log").write_bytes(bytes(range(256)) * 64)
    (tmp_path / "model.ckpt").write_bytes(os.urandom(4096))
    data = ingest_logs([tmp_path])
    assert data.files == [str(tmp_path / "worker_0.log")]
    assert any("looks binary" in w for w in data.warnings)


def test_explicit_binary_file_is_read_with_a_warning(tmp_path):
    junk = tmp_path / "junk.bin"
    junk.write_bytes(os.urandom(50_000) + b"\x00" * 100 + b"\nstep 3 loss 0.7\n")
    data = ingest_logs([junk])
    assert any("looks binary" in w for w in data.warnings)
    assert data.losses["loss"].to_list()[-1] == 0.7


def test_non_utf8_bytes_are_replaced(tmp_path):
    log = tmp_path / "train.log"
    log.write_bytes(
        "步骤 1 训练\n".encode("gbk") + b"step 2 loss 0.5 \xff\xfe\n[ERROR] HCCL \xe4\xb8 connect timeout\n"
    )
    data = ingest_logs([log])
    assert data.losses.select("step", "loss", "line").rows() == [(2, 0.5, 2)]
    assert data.events[0].kind == "timeout" and "\ufffd" in data.events[0].raw


def test_truncated_log_keeps_its_partial_last_line(tmp_path):
    log = tmp_path / "rank0.log"
    log.write_bytes(b"step 1 loss 0.5\nstep 2 loss 0.4\nstep 3 lo")
    data = ingest_logs([log])
    assert data.losses["step"].to_list() == [1, 2]


def test_long_lines_are_bounded(tmp_path):
    log = tmp_path / "rank0.log"
    with open(log, "wb") as f:
        f.write(b"step 1 loss 0.5\n")
        f.write(b"x" * (10 << 20) + b" loss 9.9\n")  # 10 MB line: only its start is read
        f.write(b"step 3 loss 0.3\n")
        f.write(b"{" + b'"a": 1, ' * (100 << 20 >> 3))  # 100 MB single line, no newline at all
    data = ingest_logs([log])
    assert data.losses.select("step", "line").rows() == [(1, 1), (3, 3)]
    long = [w for w in data.warnings if "only its start was read" in w]
    assert len(long) == 2 and f"{log}:2:" in long[0] and f"{log}:4:" in long[1]


def test_hostile_lines_parse_in_bounded_time(tmp_path):
    hostile = [
        "hccl " * 1600,
        "a." * 4000 + " RuntimeError",
        "NCCL INFO " * 800 + "x",
        "loss " * 1600,
        "step " * 1600 + "loss",
        "[" * 8000 + "loss 1",
        "a" * 4000 + " " + "a" * 4000 + " loss",
        "Error" * 1600,
    ]
    (tmp_path / "rank0.log").write_text("\n".join(hostile * 5) + "\n")
    t0 = time.perf_counter()
    ingest_logs([tmp_path])
    assert time.perf_counter() - t0 < 5


def test_truncated_gzip_is_a_warning(tmp_path):
    payload = gzip.compress(b"".join(b"step %d loss 0.5\n" % i for i in range(1, 20000)))
    (tmp_path / "train.log.gz").write_bytes(payload[: len(payload) // 2])
    data = ingest_logs([tmp_path])
    assert data.losses.height > 100
    assert any("corrupt compressed" in w or "read error" in w for w in data.warnings)


def test_missing_ranks_and_mixed_world_sizes(tmp_path):
    for rank in (0, 1, 3):
        (tmp_path / f"rank{rank}.log").write_text("step 1 loss 0.5\n")
    (tmp_path / "other_run").mkdir()
    for rank in range(8):
        (tmp_path / "other_run" / f"worker_{rank}.log").write_text(
            f"node:1:2 [0] NCCL INFO comm 0x1 rank {rank} nranks 8 cudaDev 0 - Init COMPLETE\nstep 1 loss 0.5\n"
        )
    data = ingest_logs([tmp_path])
    assert sorted(data.losses["rank"].unique().to_list()) == list(range(8))
    assert data.losses.height == 11


def test_unreadable_file_is_a_warning(tmp_path):
    if os.geteuid() == 0:
        pytest.skip("root reads everything")
    good, bad = tmp_path / "a.log", tmp_path / "b.log"
    good.write_text("step 1 loss 0.5\n")
    bad.write_text("step 1 loss 0.5\n")
    bad.chmod(0)
    data = ingest_logs([tmp_path])
    assert data.losses.height == 1 and any("b.log" in w for w in data.warnings)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.binary(max_size=4000))
def test_random_bytes_never_raise(tmp_path, blob):
    path = tmp_path / "fuzz.log"
    path.write_bytes(blob)
    data = ingest_logs([path])
    assert data.files == [str(path)]
    assert all(isinstance(w, str) and "\n" not in w for w in data.warnings)


_LINE = st.one_of(
    st.text(alphabet=st.characters(blacklist_characters="\n\x1f"), max_size=60),
    st.sampled_from(["step 1 loss 0.5", "RuntimeError: boom", "", "\r", "loss", "NCCL WARN x"]),
)


_TRICKY = st.sampled_from(
    [
        b"\r",
        b"\n",
        b"\r\n",
        b"\x1f",
        b"\xe4\xb8",
        b"\xff",
        b'"',
        b"#",
        b",",
        b"\x00",
        b"\xef\xbb\xbf",
        b"a",
    ]
)


@settings(max_examples=150, deadline=None)
@given(st.binary(max_size=3000) | st.lists(_TRICKY, max_size=80).map(b"".join))
def test_polars_splits_exactly_at_newlines(blob):
    """Line numbers are counted from the CSV reader's rows: one row per "\n", always."""
    block = blob + b"\n"
    frame = _split_lines(block)
    assert frame.height == block.count(b"\n")
    expected = block.decode("utf-8", errors="replace").split("\n")[:-1]
    for i, (want, have) in enumerate(zip(expected, frame["l"].to_list(), strict=True)):
        if "\r" in want or "\x1f" in want:
            continue  # "\r" and the separator byte may change a row's text, never the row count
        assert (have or "") == (want.removeprefix("\ufeff") if i == 0 else want)  # a BOM is dropped


@settings(max_examples=60, deadline=None)
@given(st.lists(_LINE, max_size=80), st.integers(min_value=16, max_value=400))
def test_chunked_scan_numbers_lines_exactly(lines, chunk_bytes):
    """Candidate line numbers and texts match a plain split, whatever the chunking."""
    blob = "\n".join(lines).encode("utf-8", errors="replace") + b"\n"
    expected = blob.decode("utf-8").split("\n")[:-1]
    got = [
        (n, t)
        for c in iter_chunks(io.BytesIO(blob), chunk_bytes=chunk_bytes)
        for n, t in zip(c.lines, c.texts, strict=True)
    ]
    assert all(expected[n - 1].rstrip("\r") == t for n, t in got)
    total = sum(c.n_lines for c in iter_chunks(io.BytesIO(blob), chunk_bytes=chunk_bytes))
    assert total == len(expected)
    assert len(blob) < MAX_LINE_BYTES


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.sampled_from([0, 1, 7, 60, 150, 299, 300, 301, 900]), max_size=40),
    st.sampled_from([b"", b"\n", b"tail"]),
    st.integers(min_value=16, max_value=700),
)
def test_blocks_of_a_file_are_those_of_a_stream(lengths, end, chunk_bytes):
    """A plain file's blocks are read exactly (probe the window's end, read the block
    in one go): the same blocks, carries and cut long lines as a stream's."""
    blob = b"\n".join(bytes((97 + (i * 7 + n) % 3) for i in range(n)) for n in lengths) + end
    old = scan.MAX_LINE_BYTES, scan.PROBE_BYTES
    scan.MAX_LINE_BYTES, scan.PROBE_BYTES = 300, 64  # long lines and probes without a newline
    try:
        want = list(scan._blocks(TolerantStream(io.BytesIO(blob)), chunk_bytes))  # no seek: the generic path
        got = list(scan._blocks(io.BytesIO(blob), chunk_bytes))
    finally:
        scan.MAX_LINE_BYTES, scan.PROBE_BYTES = old
    assert got == want


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    st.lists(st.text(alphabet="abc xyz=:|[]{}'\"0123456789.-", max_size=40), max_size=30),
    st.integers(0, 30),
)
def test_loss_line_found_at_its_line(tmp_path, noise, where):
    where = min(where, len(noise))
    lines = [*noise[:where], "step 77 loss 0.125", *noise[where:]]
    path = Path(tmp_path) / "fuzz.log"
    path.write_text("\n".join(lines) + "\n")
    data = ingest_logs([path])
    rows = data.losses.filter(data.losses["loss"] == 0.125).select("line").to_series().to_list()
    assert where + 1 in rows


def test_gbk_log_is_text_and_gzip_is_read(tmp_path):
    gbk = ("第一轮训练开始，学习率调整完成。\n" * 300).encode("gbk") + b"step 1 loss 0.5\n"
    (tmp_path / "train.log0").write_bytes(gbk)
    (tmp_path / "train.log1.gz").write_bytes(gzip.compress(b"step 1 loss 0.6\n"))
    data = ingest_logs([tmp_path])
    assert sorted(data.losses.select("rank", "loss").rows()) == [(0, 0.5), (1, 0.6)]
    assert not any("binary" in w for w in data.warnings)


def test_hf_trainer_state_json(tmp_path):
    import json

    state = {
        "log_history": [
            {"epoch": 0.1, "grad_norm": 3.0, "learning_rate": 5e-05, "loss": 2.3, "step": 10},
            {"epoch": 0.2, "eval_loss": 2.1, "step": 20},
            {"epoch": 0.2, "grad_norm": 2.0, "learning_rate": 4e-05, "loss": 2.0, "step": 20},
        ]
    }
    (tmp_path / "checkpoint-20").mkdir()
    (tmp_path / "checkpoint-20" / "trainer_state.json").write_text(json.dumps(state))
    (tmp_path / "config.json").write_text("{}")  # not a log
    data = ingest_logs([tmp_path])
    assert data.losses.select("step", "loss", "lr", "grad_norm").rows() == [
        (10, 2.3, 5e-05, 3.0),
        (20, 2.0, 4e-05, 2.0),
    ]
    assert list(data.formats.values()) == ["hf_trainer_state"]


def test_a_step_and_ranks_past_int64_in_a_log_line_are_no_step(tmp_path: Path) -> None:
    # Found by the fuzz tier: the mismatch rule read "at step 999…9" (400 digits) as the
    # finding's step, and the upstream check then compared it with the Int64 step column.
    from syncdoctor.doctor.diagnose import diagnose

    huge = "9" * 400
    (tmp_path / "rank3.log").write_text(
        f"[ERROR] GRADIENT_SYNC: Rank 1{huge} and Rank 2 parameter gradient mismatch at step {huge}\n"
    )
    top = diagnose([tmp_path]).findings[0]
    assert top.code == "SD405" and top.step is None and top.ranks == [2], top
