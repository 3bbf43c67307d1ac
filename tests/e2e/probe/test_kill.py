"""SIGKILL a rank at the probe's most delicate moments (mid-record, with the
cross-rank check in flight, inside a DDP comm hook): the survivor ends within the
process-group timeout, every record before the kill is readable, and no process
is left behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from syncdoctor.lab.launch import end_process_groups, free_port
from syncdoctor.probe.run.launcher import prepare
from syncdoctor.probe.torch.probe import DEFAULT_CHECK_EVERY
from syncdoctor.records import read_run

pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).parent / "scripts" / "ddp_train.py"
PG_TIMEOUT_S = 10.0
MARGIN_S = 15.0  # interpreter exit, the probe's bounded close, a loaded 2-core machine
PAUSE_STEP = 7  # not a check step for "record" / "hook"; the first check after step 1 runs at K
START_BUDGET_S = 120.0


def _alive_in_sessions(sids: set[int]) -> list[int]:
    """Live (not zombie) processes in the sessions our ranks led: the ranks, their tees."""
    left = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z" and int(fields[3]) in sids:
            left.append(int(entry.name))
    return left


@pytest.mark.parametrize(
    ("where", "step", "extra"),
    [
        ("record", PAUSE_STEP, []),  # an every-step record, in the memory-mapped tail
        ("record", DEFAULT_CHECK_EVERY, []),  # a check step's record, after the pending steps, in one write
        ("check", DEFAULT_CHECK_EVERY, []),
        ("hook", PAUSE_STEP, ["--comm-hook"]),
    ],
    ids=["step-record", "check-record", "check", "comm-hook"],
)
def test_sigkill_a_rank(tmp_path: Path, where: str, step: int, extra: list[str]) -> None:
    out = tmp_path / "run"
    env = prepare(out, None, None)
    marker = tmp_path / "paused"
    port = free_port()
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for rank in range(2):
            rank_env = dict(
                env,
                RANK=str(rank),
                WORLD_SIZE="2",
                MASTER_ADDR="127.0.0.1",
                MASTER_PORT=str(port),
                OMP_NUM_THREADS="1",
                GLOO_SOCKET_IFNAME="lo",
                SYNCDOCTOR_TEST_PAUSE=f"{where}:1:{step}",
                SYNCDOCTOR_TEST_MARKER=str(marker),
            )
            procs.append(
                subprocess.Popen(
                    [
                        sys.executable,
                        str(SCRIPT),
                        "--steps",
                        str(DEFAULT_CHECK_EVERY + 10),
                        "--pg-timeout",
                        str(PG_TIMEOUT_S),
                        *extra,
                    ],
                    env=rank_env,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                    start_new_session=True,
                )
            )
        deadline = time.monotonic() + START_BUDGET_S
        while not marker.exists():
            assert time.monotonic() < deadline, "rank 1 never reached the pause point"
            assert procs[1].poll() is None, "rank 1 ended before the pause point"
            time.sleep(0.05)
        time.sleep(0.3)  # let rank 0 run into its wait on rank 1
        assert int(marker.read_text()) == procs[1].pid
        killed_at = time.monotonic()
        os.kill(procs[1].pid, signal.SIGKILL)
        procs[1].wait(timeout=10)
        code = procs[0].wait(timeout=PG_TIMEOUT_S + MARGIN_S)  # no hang: ends within the pg timeout
        assert time.monotonic() - killed_at < PG_TIMEOUT_S + MARGIN_S
        assert code != 0  # its collective failed: the error reaches training as without the probe
    finally:
        end_process_groups(procs)
    sids = {p.pid for p in procs}
    deadline = time.monotonic() + 10
    while _alive_in_sessions(sids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive_in_sessions(sids)

    run = read_run(out)
    last = step - 1 if where != "check" else step
    for rank in (0, 1):  # each step once: a step both in the file and in the tail is taken once
        steps = run.steps.filter(run.steps["rank"] == rank)["step"].to_list()
        assert steps[:last] == list(range(1, last + 1)), (rank, steps)
    assert run.steps.filter(run.steps["rank"] == 1)["step"].max() == last  # nothing after the kill
    if where == "record" and step == DEFAULT_CHECK_EVERY:
        assert any("truncated" in w for w in run.warnings)  # the half-written record is dropped
    if step == PAUSE_STEP:  # the steps since the last write came from rank 1's tail file
        assert any("rank1.jsonl" in w and ".tail, not yet in the file" in w for w in run.warnings), run.warnings
    survivor_checks = [c for c in run.checks if c["rank"] == 0]
    assert 0 in run.ends or any(c["status"] == "incomplete" for c in survivor_checks)
    assert run.ends.get(0, {}).get("status") in (None, "exception")
    assert "rank 0 step" in (out / "logs" / "rank0.log").read_text()
    assert "rank 1 step" in (out / "logs" / "rank1.log").read_text()  # the killed rank's log survives
