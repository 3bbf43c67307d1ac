"""The rule registry: every module in this package named sdNNN_*.py holds one rule."""

from __future__ import annotations

import sys
from functools import cache

from syncdoctor.doctor.rules.base import Rule
from syncdoctor.rulebook import discover


@cache
def all_rules() -> list[type[Rule]]:
    return discover(sys.modules[__name__], Rule)


__all__ = ["Rule", "all_rules"]
