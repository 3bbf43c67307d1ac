"""Coverage-guided fuzzing (atheris/libFuzzer) of the four targets, each harness in
its own process with a bounded budget: SYNCDOCTOR_FUZZ_SECONDS each (default 5; the fuzz/ campaign runs longer).
A crash, a hang past -timeout or an exception outside the contract makes libFuzzer
exit non-zero and leave the input as crash-* in the test's folder."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import FUZZ_SEED

atheris = pytest.importorskip(
    "atheris", reason="atheris not installed (pip install atheris; wheels for CPython 3.8-3.11 on Linux)"
)

FUZZ_DIR = Path(__file__).resolve().parents[3] / "fuzz"
SECONDS = int(os.environ.get("SYNCDOCTOR_FUZZ_SECONDS", "5"))
_EXECUTED = re.compile(r"stat::number_of_executed_units:\s*(\d+)")


@pytest.mark.parametrize("target", ["logs", "records", "rank_table", "diagnose"])
def test_atheris_harness_runs_clean(target, tmp_path, fuzz_counts):
    proc = subprocess.run(
        [
            sys.executable,
            "-W",
            "ignore::RuntimeWarning",
            str(FUZZ_DIR / f"fuzz_{target}.py"),
            f"-max_total_time={SECONDS}",
            "-timeout=30",
            "-rss_limit_mb=4096",
            "-print_final_stats=1",
            f"-artifact_prefix={tmp_path}/",
            *([f"-seed={FUZZ_SEED}"] if FUZZ_SEED else []),  # CI: the same draws each run (tests/conftest.py)
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=SECONDS + 120,
    )
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-4000:]
    executed = _EXECUTED.search(log)
    assert executed, log[-2000:]
    fuzz_counts[f"atheris/{target}"] += int(executed.group(1))
    assert int(executed.group(1)) > 0
