"""Where the preflight's callers (engine, CLI, tests) find the checks: the registry of
`syncdoctor.preflight.checks` (rulebook.Registry), under the names they import."""

from __future__ import annotations

from syncdoctor.preflight.checks import CHECKS, all_checks, get_check

__all__ = ["CHECKS", "all_checks", "get_check"]
