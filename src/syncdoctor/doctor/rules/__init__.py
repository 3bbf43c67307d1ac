"""The rule registry: every module in this package named sdNNN_*.py holds one rule
(rulebook.Registry, the same shape as preflight/checks/)."""

from __future__ import annotations

from syncdoctor.doctor.rules.base import Rule
from syncdoctor.rulebook import Registry

RULES: Registry[Rule] = Registry(__name__, Rule)
all_rules = RULES.all
get_rule = RULES.get

__all__ = ["RULES", "Rule", "all_rules", "get_rule"]
