"""Confidences measured, not set by hand.

A rule's confidence is how often its cause was the right one where it fired: over
labelled runs and logs (the lab's faults at two world sizes, every rule's fixtures,
the dev part of the corpus of public logs), counted by `scripts/measure_rules.py`
into `measured.json` beside this module. A rule that fires on the consequences of
other faults (replicas parted, a loss that jumps) is right where it fires less often
than one that fires only on its own cause, so it ranks below it: the measurement,
not a hand-set number, says which findings are causes.

The finding's own confidence (its rule's estimate for this case) is the prior, worth
PRIOR_WEIGHT labelled runs: a rule measured on few runs stays near its estimate, one
measured on many is what it measured. The measurement only ever lowers an estimate:
the labelled runs were made to show each rule's own fault, so a rule right in all of
its few runs says little more than its estimate did (and ranking two such rules by 7
of 7 against 1 of 1 would be ranking by noise), while a rule wrong in most of the runs
where it fired has shown what it reads. Notes (severity info) are not causes and keep
their own. `docs/confidence.md` gives the table.
"""

from __future__ import annotations

import json
from dataclasses import replace
from functools import cache
from pathlib import Path

from syncdoctor.doctor.model import Finding

MEASURED_FILE = Path(__file__).with_name("measured.json")
PRIOR_WEIGHT = 2.0


@cache
def measured_counts() -> dict[str, tuple[int, int]]:
    """code -> (right, fired) over the labelled runs; empty where the file is absent."""
    try:
        data = json.loads(MEASURED_FILE.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return {code: (int(c["right"]), int(c["fired"])) for code, c in data.get("rules", {}).items()}


def calibrated(finding: Finding, counts: dict[str, tuple[int, int]] | None = None) -> Finding:
    """The finding with its confidence measured (a copy; the input is left as it is)."""
    counts = measured_counts() if counts is None else counts
    if finding.severity == "info" or finding.code not in counts:
        return finding
    right, fired = counts[finding.code]
    confidence = min(finding.confidence, (right + PRIOR_WEIGHT * finding.confidence) / (fired + PRIOR_WEIGHT))
    return replace(finding, confidence=round(confidence, 2), measured=[right, fired])
