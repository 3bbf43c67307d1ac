"""The preflight part of syncdoctor: checks rank tables, per-rank environments,
training scripts and code consistency before a data-parallel job starts."""

from syncdoctor.preflight.checks.base import Check
from syncdoctor.preflight.engine import run_preflight
from syncdoctor.preflight.model import Hit, PreflightFinding
from syncdoctor.preflight.registry import all_checks

__all__ = ["Check", "Hit", "PreflightFinding", "all_checks", "run_preflight"]
