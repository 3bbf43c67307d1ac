"""Healing a corrupted replica (on_mismatch="heal") on real 3-rank jobs: the odd rank
is restored from the majority and the replicas end bitwise equal; a rank that is
late at the check defers the heal to a later check; one late at the heal step makes
every rank skip it (bounded wait, no hang)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from syncdoctor.lab.launch import free_port, run_ranks
from syncdoctor.probe.torch.heal import block_for
from syncdoctor.records import read_run

SCRIPT = Path(__file__).parent / "scripts" / "heal_job.py"
WORLD = 3


def run_job(tmp_path: Path, mode: str, wait_s: float = 10.0) -> tuple[Path, list[int | None]]:
    run_dir = tmp_path / mode
    run_dir.mkdir()
    port = free_port()
    envs = []
    for rank in range(WORLD):
        env = dict(
            os.environ,
            RANK=str(rank),
            WORLD_SIZE=str(WORLD),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            OMP_NUM_THREADS="1",
            GLOO_SOCKET_IFNAME="lo",
            SYNCDOCTOR_HEAL_WAIT_S=str(wait_s),
        )
        envs.append(env)
    codes, timed_out = run_ranks(
        [[sys.executable, str(SCRIPT), str(run_dir), mode]] * WORLD,
        envs,
        [run_dir / f"log{r}" for r in range(WORLD)],
        timeout_s=240,
    )
    assert not timed_out, [(run_dir / f"log{r}").read_text()[-2000:] for r in range(WORLD)]
    return run_dir, codes


def finals(run_dir: Path) -> list[str]:
    return [json.loads((run_dir / f"final{r}.json").read_text())["params"] for r in range(WORLD)]


def heals(run_dir: Path) -> list[dict]:
    return [e for e in read_run(run_dir).events if e.get("event") == "heal"]


def test_block_for_heal_reads_often() -> None:
    assert block_for(1) == 10 and block_for(5) == 2 and block_for(10) == 1 and block_for(50) == 1


@pytest.mark.slow
def test_heal_restores_the_odd_replica_from_the_majority(tmp_path: Path) -> None:
    run_dir, codes = run_job(tmp_path, "flip")
    assert codes == [0] * WORLD
    done = [e for e in heals(run_dir) if e["heal"]["status"] == "healed"]
    assert sorted(e["rank"] for e in done) == list(range(WORLD))  # every rank took part, at one step
    assert len({e["step"] for e in done}) == 1
    heal = done[0]["heal"]
    assert heal["odd"] == [1] and heal["source"] in (0, 2) and heal["check_step"] == 6
    # Decided at the check that posted the flip's block (K = 2): the copy took no further step.
    assert done[0]["step"] == 8
    assert heal["bytes"] > 0
    assert len(set(finals(run_dir))) == 1  # bitwise equal at the end
    run = read_run(run_dir)
    later = [c for c in run.checks if c["step"] > done[0]["step"]]
    assert later and all(c["status"] == "ok" for c in later)


@pytest.mark.slow
def test_a_rank_late_at_the_check_defers_the_heal_to_a_later_check(tmp_path: Path) -> None:
    run_dir, codes = run_job(tmp_path, "late", wait_s=3.0)
    assert codes == [0] * WORLD
    done = [e for e in heals(run_dir) if e["heal"]["status"] == "healed"]
    assert sorted(e["rank"] for e in done) == list(range(WORLD)) and len({e["step"] for e in done}) == 1
    assert done[0]["step"] > 8 and done[0]["heal"]["check_step"] == 6
    assert len(set(finals(run_dir))) == 1


@pytest.mark.slow
def test_a_late_rank_makes_every_rank_skip_the_heal(tmp_path: Path) -> None:
    run_dir, codes = run_job(tmp_path, "slow", wait_s=3.0)
    assert codes == [0] * WORLD  # no hang, no crash: the job ran to its end
    outcome = {e["rank"]: e["heal"]["status"] for e in heals(run_dir) if e["heal"]["status"] != "refused"}
    assert outcome == {0: "aborted", 1: "aborted", 2: "aborted"}
    assert len(set(finals(run_dir))) > 1  # nothing was restored: the mismatch stands, reported
