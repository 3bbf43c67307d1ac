"""The rule registry: every module in this package named sdNNN_*.py holds one rule."""

from __future__ import annotations

import importlib
import pkgutil
from functools import cache

from syncdoctor.doctor.rules.base import Rule


@cache
def all_rules() -> list[type[Rule]]:
    for info in pkgutil.iter_modules(__path__):
        if info.name.startswith("sd"):
            importlib.import_module(f"{__name__}.{info.name}")
    rules = [r for r in _subclasses(Rule) if getattr(r, "code", None)]
    return sorted(rules, key=lambda r: r.code)


def _subclasses(cls: type) -> list[type]:
    out = []
    for sub in cls.__subclasses__():
        out.append(sub)
        out.extend(_subclasses(sub))
    return out


__all__ = ["Rule", "all_rules"]
