"""Property tests: hostile inputs through the four targets (fuzz/targets.py holds
the contract: only documented input errors escape). Bounded for CI; scale with
SYNCDOCTOR_FUZZ_SCALE=10 for a longer local run."""

from __future__ import annotations

import os
import sys
import warnings
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "fuzz"))
import targets  # noqa: E402

from .strategies import log_folders, rank_table_texts, record_folders  # noqa: E402

SCALE = float(os.environ.get("SYNCDOCTOR_FUZZ_SCALE", "1"))


def fuzz_settings(examples: int) -> settings:
    return settings(
        max_examples=max(1, int(examples * SCALE)),
        deadline=None,  # a shared 2-core CI box: timing is not the property under test
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )


@pytest.fixture(autouse=True)
def _quiet_numpy_warnings():
    # The contract is "no exception"; RuntimeWarnings from numpy on 1e308 are not one.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        yield


def _tally(counts: Counter[str], name: str) -> None:
    counts[f"hypothesis/{name}"] += 1


def test_ingest_logs_never_raises(fuzz_counts):
    @fuzz_settings(150)
    @given(log_folders())
    def run(files):
        _tally(fuzz_counts, "logs")
        targets.check_logs(files)

    run()


def test_read_run_never_raises(fuzz_counts):
    @fuzz_settings(200)
    @given(record_folders())
    def run(files):
        _tally(fuzz_counts, "records")
        targets.check_records(files)

    run()


def test_rank_table_reader_and_checks_never_raise(fuzz_counts):
    @fuzz_settings(300)
    @given(rank_table_texts())
    def run(text):
        _tally(fuzz_counts, "rank_table")
        targets.check_rank_table(text)

    run()


def test_diagnose_and_reports_never_raise(fuzz_counts):
    @fuzz_settings(150)
    @given(record_folders(), log_folders())
    def run(records, logs):
        _tally(fuzz_counts, "diagnose")
        targets.check_diagnose(records, logs)

    run()


def test_cli_diagnose_returns_an_exit_code(fuzz_counts):
    @fuzz_settings(25)
    @given(record_folders(), log_folders())
    def run(records, logs):
        _tally(fuzz_counts, "cli")
        targets.check_cli(records, logs)

    run()


@pytest.mark.parametrize(
    "records",
    [
        {"rank0.jsonl": b'{"v":1,"kind":"snapshot","world_size":4611686018427387904}\n'},
        {"rank0.jsonl": b'{"v":1,"kind":"step","rank":4611686018427387904,"step":1,"loss":1}\n'},
        {"rank0.jsonl": b'{"v":1,"kind":"check","status":"mismatch","ranks":[1]}\n'},
        {"rank0.jsonl": b'{"v":1,"kind":"step","rank":0,"step":1,"opt_steps":Infinity}\n'},
        {"rank99999999999999999999.jsonl": b'{"v":1,"kind":"end"}\n'},
    ],
    ids=["world-2^62", "step-rank-2^62", "check-without-step", "infinity-token", "huge-rank-file"],
)
def test_found_by_fuzzing_records(records):
    """Inputs the fuzzers found that once hung or crashed the doctor (kept as
    regressions: each finishes in well under a second now)."""
    targets.check_diagnose(records, {"train.log0": b"step 1 loss 0.5\n"})


@pytest.mark.parametrize(
    "log",
    [
        b"[rank99999] step 1 loss 0.5\nrank 3 step 1 loss 0.4\n",
        b"10%|#| 1/1208925819614629174706175 [00:01<00:02, loss=0.5]\n",
        b"Epoch [1/4] Step [4611686018427387903] Loss: 1\nEpoch [1e300/4] Step [1] Loss: 1\n"
        b"Epoch [1e308/4] Step [2] Loss: 1\n",
        b"step 1 loss 1e308\nstep 2 loss -1e308\nstep 3 loss 1e308\nstep 4 loss 1.7e308\n" * 3,
    ],
    ids=["rank-99999", "total-beyond-int64", "step-beyond-int64", "overflowing-curve"],
)
def test_found_by_fuzzing_logs(log):
    targets.check_diagnose({}, {"rank99999.log": log})


def test_hostile_values_in_rank_table_are_escaped():
    table = (
        b'{"server_count":"1","server_list":[{"server_id":"a\\u001b[2J\\nb","device":'
        b'[{"device_id":"0","device_ip":"x\\u0007","rank_id":[]},'
        b'{"device_id":"0","device_ip":"x\\u0007","rank_id":[]}]}]}'
    )
    assert targets.check_rank_table(table) is not None


def test_found_by_fuzzing_a_record_kind_that_is_a_list(tmp_path) -> None:
    from syncdoctor.records import read_run

    (tmp_path / "records").mkdir()
    (tmp_path / "records" / "rank0.jsonl").write_text(
        '{"v":1,"kind":"snapshot","rank":0,"world_size":1}\n{"v":1,"kind":["step"],"rank":0,"step":1}\n'
    )
    run = read_run(tmp_path)
    assert 0 in run.snapshots and run.steps.height == 0
