"""The check registry: one module per preflight check code (PF1xx rank table, PF2xx
environment, PF3xx training scripts, PF4xx code consistency across nodes), found
by rulebook.Registry, the same shape as doctor/rules/."""

from __future__ import annotations

from syncdoctor.preflight.checks.base import Check
from syncdoctor.rulebook import Registry

CHECKS: Registry[Check] = Registry(__name__, Check)
all_checks = CHECKS.all
get_check = CHECKS.get

__all__ = ["CHECKS", "Check", "all_checks", "get_check"]
