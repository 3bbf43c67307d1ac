"""The check registry: every `Check` subclass defined in a module of
`syncdoctor.preflight.checks` is a check, found by importing the package's modules."""

from __future__ import annotations

import importlib
import pkgutil
from functools import cache

from syncdoctor.preflight import checks as _checks_pkg
from syncdoctor.preflight.model import Check


@cache
def _discover() -> tuple[type[Check], ...]:
    found: dict[str, type[Check]] = {}
    for info in pkgutil.iter_modules(_checks_pkg.__path__):
        module = importlib.import_module(f"{_checks_pkg.__name__}.{info.name}")
        for obj in vars(module).values():
            if (
                isinstance(obj, type)
                and issubclass(obj, Check)
                and obj is not Check
                and obj.__module__ == module.__name__
            ):
                if obj.code in found:
                    raise RuntimeError(f"preflight check code {obj.code} defined twice")
                found[obj.code] = obj
    return tuple(found[code] for code in sorted(found))


def all_checks() -> list[type[Check]]:
    """Every preflight check class, sorted by code."""
    return list(_discover())


def get_check(code: str) -> type[Check] | None:
    return next((c for c in _discover() if c.code == code.upper()), None)
