"""Comparing one value across ranks, the same way in the probe and in the doctor."""

from __future__ import annotations

from collections import Counter
from typing import Any


def majority_outliers(values: dict[int, Any]) -> list[int]:
    """Ranks whose value is not the most common one; on a tie the lowest rank's value
    counts as the reference (with two ranks, rank 0 is taken as right)."""
    counts = Counter(values.values())
    top = max(counts.values())
    ranks = sorted(values)
    winner = next(values[r] for r in ranks if counts[values[r]] == top)
    return [r for r in ranks if values[r] != winner]
