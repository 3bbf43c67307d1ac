"""Fuzz tallies: each fuzz test adds how many inputs it ran; the end of the session
prints the totals (the issue asks for the figure) and writes them as JSON to
$SYNCDOCTOR_FUZZ_REPORT when that is set."""

from __future__ import annotations

import json
import os
from collections import Counter

import pytest

FUZZ_COUNTS: Counter[str] = Counter()


@pytest.fixture(scope="session")
def fuzz_counts() -> Counter[str]:
    return FUZZ_COUNTS


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not FUZZ_COUNTS:
        return
    terminalreporter.section("fuzz inputs tried")
    for name, n in sorted(FUZZ_COUNTS.items()):
        terminalreporter.write_line(f"{name:<28} {n:>9,}")
    terminalreporter.write_line(f"{'total':<28} {sum(FUZZ_COUNTS.values()):>9,}")
    out = os.environ.get("SYNCDOCTOR_FUZZ_REPORT")
    if out:
        with open(out, "w", encoding="utf-8") as f:
            json.dump(dict(FUZZ_COUNTS), f, indent=1)
