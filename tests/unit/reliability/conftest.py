"""Fuzz tallies: each fuzz test adds how many inputs it ran to the session's counter
(tests/conftest.py keeps it: under pytest-xdist the workers' counts are summed there),
and the end of the session prints the totals (the issue asks for the figure) and
writes them as JSON to $SYNCDOCTOR_FUZZ_REPORT when that is set."""

from __future__ import annotations

from collections import Counter

import pytest

from tests.conftest import FUZZ_COUNTS


@pytest.fixture(scope="session")
def fuzz_counts() -> Counter[str]:
    return FUZZ_COUNTS
