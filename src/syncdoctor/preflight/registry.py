"""The check registry: every `Check` subclass defined in a module of
`syncdoctor.preflight.checks` is a check, found by importing the package's modules."""

from __future__ import annotations

from functools import cache

from syncdoctor.preflight import checks as checks_package
from syncdoctor.preflight.model import Check
from syncdoctor.rulebook import discover


@cache
def _discover() -> tuple[type[Check], ...]:
    return tuple(discover(checks_package, Check))


def all_checks() -> list[type[Check]]:
    """Every preflight check class, sorted by code."""
    return list(_discover())


def get_check(code: str) -> type[Check] | None:
    return next((c for c in _discover() if c.code == code.upper()), None)
