"""Comparing one value across ranks, the same way in the probe and in the doctor.

A culprit is named only where a strict majority agrees: with two ranks, or a 2-2
split, nothing says which side is right (a third replica or a recomputation would),
so every disagreeing rank is reported and `has_majority` is False.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Agreement:
    """How the ranks' values of one quantity split."""

    has_majority: bool  # more than half of the ranks share one value
    reference: Any  # that value (None without a majority)
    majority: list[int]  # the ranks holding it
    odd: list[int]  # the ranks outside it; without a majority, every rank not in agreement

    @property
    def agree(self) -> bool:
        return not self.odd


def agreement(values: dict[int, Any]) -> Agreement:
    """Split `values` (rank -> value) into the majority and the odd ranks."""
    if not values:
        return Agreement(True, None, [], [])
    counts = Counter(values.values())
    ranks = sorted(values)
    if len(counts) == 1:
        return Agreement(True, values[ranks[0]], ranks, [])
    value, top = counts.most_common(1)[0]
    if top * 2 > len(values):
        return Agreement(
            True, value, [r for r in ranks if values[r] == value], [r for r in ranks if values[r] != value]
        )
    # No majority: a rank that shares its value with nobody is surely odd, but every
    # side of a split is suspect, so all ranks are named.
    return Agreement(False, None, [], ranks)


def majority_outliers(values: dict[int, Any]) -> list[int]:
    """Ranks whose value is not the majority's; every rank when there is no strict
    majority (two ranks that disagree name both: neither is known to be right)."""
    return agreement(values).odd


def _compact(value: Any) -> str:
    return f"{value:.6g}" if isinstance(value, float) else str(value)


def describe_split(values: dict[int, Any], fmt: Any = _compact) -> str:
    """The differing values side by side, per rank: `0.05 (rank 0) vs 0.0001 (ranks 1, 2)`."""
    groups: dict[str, list[int]] = {}
    for rank in sorted(values):
        groups.setdefault(fmt(values[rank]), []).append(rank)
    ordered = sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[1][0]))
    return " vs ".join(
        f"{text} ({'rank' if len(rs) == 1 else 'ranks'} {', '.join(map(str, _span(rs)))})" for text, rs in ordered
    )


def _span(ranks: list[int], limit: int = 8) -> list[str]:
    shown = [str(r) for r in ranks[:limit]]
    if len(ranks) > limit:
        shown.append(f"… {len(ranks) - limit} more")
    return shown
