"""Thresholds that a rule shares with other parts of the doctor (the baseline
comparison, the experiment's verdict): one number, one place. A threshold only one
rule reads stays in that rule's module."""

from __future__ import annotations

# SD101 and the baseline comparison: the peak over the starting loss that healthy
# training never reaches.
BLOW_UP = 5.0

# SD701 and the experiment's comparison: in some window of consecutive steps, |t| of
# the mean offset, the share of steps on the same side, and the size, that ranks
# reading different data do not reach by chance.
OFFSET_T = 6.0
OFFSET_SAME_SIDE = 0.9
OFFSET_MIN = 0.03
