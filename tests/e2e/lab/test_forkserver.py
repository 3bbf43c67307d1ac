"""The fork server (lab/forkserver.py): each lab rank forked from one interpreter that
imported torch once is still a process of its own, seeded, signalled and ended as a
spawned rank is, and computes exactly what a spawned rank computes."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from syncdoctor.lab import forkserver
from syncdoctor.lab.runner import SPAWN_ENV, run_lab
from tests.conftest import LAB_PG_TIMEOUT_S, pids_running_with

RANK = "tests.e2e.lab.forked_rank"


@pytest.fixture(scope="module")
def server() -> Iterator[forkserver.ForkServer]:
    started = forkserver.ForkServer()
    yield started
    started.close()


def _seen(log: Path) -> dict:
    return json.loads(log.read_text().splitlines()[0])


def test_each_forked_rank_is_a_process_of_its_own(server, tmp_path) -> None:
    argvs = [["exit", "0"], ["exit", "3"], ["raise", "boom"]]
    envs = [dict(os.environ, FORKED_RANK_TAG=f"rank{i}") for i in range(3)]
    logs = [tmp_path / f"rank{i}.log" for i in range(3)]
    codes, timed_out = forkserver.run_forked_ranks(server, RANK, argvs, envs, logs, timeout_s=60)
    assert (codes, timed_out) == ([0, 3, 1], False)
    seen = [_seen(log) for log in logs]
    assert [s["env"] for s in seen] == ["rank0", "rank1", "rank2"]  # its own environment
    assert [s["argv"] for s in seen] == argvs
    assert all(s["name"] == "__main__" for s in seen)
    assert all(s["pid"] == s["pgid"] == s["sid"] for s in seen)  # its own session, ended by group
    assert all(s["sigint_raises"] and s["sigterm_default"] for s in seen)
    # Fresh seeds on every rank, as fresh interpreters draw them: a fault like an
    # unseeded model init must differ across ranks here as it does in a real job.
    for source in ("torch_seed", "numpy", "random"):
        assert len({s[source] for s in seen}) == 3, source
    assert "RuntimeError: boom" in logs[2].read_text()  # the traceback, in the rank's log


def test_a_rank_past_its_deadline_is_ended_with_its_process_group(server, tmp_path) -> None:
    log = tmp_path / "sleeper.log"
    codes, timed_out = forkserver.run_forked_ranks(server, RANK, [["sleep", "120"]], [dict(os.environ)], [log], 3)
    assert (codes, timed_out) == ([None], True)
    assert pids_running_with(str(log)) == []


def test_a_closed_server_ends_the_ranks_it_forked(tmp_path) -> None:
    own = forkserver.ForkServer()
    log = tmp_path / "orphan.log"
    own.start(RANK, ["sleep", "120"], dict(os.environ), log)
    deadline = time.monotonic() + 60
    while not log.exists() or not log.read_text():
        assert time.monotonic() < deadline, "the rank never started"
        time.sleep(0.1)
    assert pids_running_with(str(log))
    own.close()  # as when the runner dies: the server's input closes
    deadline = time.monotonic() + 10
    while pids_running_with(str(log)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert pids_running_with(str(log)) == []


def test_a_forked_lab_run_computes_what_a_spawned_one_does(monkeypatch, tmp_path) -> None:
    def clean(folder: str):
        return run_lab("clean", steps=40, out=tmp_path / folder, pg_timeout_s=LAB_PG_TIMEOUT_S)

    forked = clean("forked")
    monkeypatch.setenv(SPAWN_ENV, "1")
    spawned = clean("spawned")
    assert (forked.started, spawned.started) == ("forked", "spawned")
    assert forked.ok and spawned.ok
    assert forked.accuracy == spawned.accuracy
    for rank in (0, 1):
        assert _steps(forked.out / f"train.log{rank}") == _steps(spawned.out / f"train.log{rank}")


def _steps(log: Path) -> list[str]:
    """The rank's step lines without their time stamps: loss, lr and gradient norm."""
    lines = [line.split(" | ", 1)[1] for line in log.read_text().splitlines() if "| step " in line]
    assert len(lines) >= 40  # whole epochs: the run ends at the end of its epoch
    return lines
