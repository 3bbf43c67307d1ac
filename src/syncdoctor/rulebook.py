"""The rulebook: what doctor rules and preflight checks have in common.

Both are small classes, one per file, with a stable code, a name, a severity and a
docstring whose **Symptom:**, **Cause:**, **Quick check:** and **Fix:** sections are
their documentation. The docstring is the only place the fix text is written: a
doctor finding, `syncdoctor rules` and `preflight --explain` all read it from there.
Both are registered the same way, as sqlfluff registers its rules: each part's
package of entries (`doctor/rules/`, `preflight/checks/`) makes one
:class:`Registry` of its base class in its ``__init__.py``, which finds the entries
by importing every module of the package (modules starting with ``_`` hold helpers);
adding an entry is adding one file. Framework-free: no torch, no polars.
"""

from __future__ import annotations

import importlib
import pkgutil
import re
from collections.abc import Iterable
from functools import cache
from types import ModuleType
from typing import Any, ClassVar, Generic, Literal, TypeVar

Severity = Literal["error", "warning", "info"]
SEVERITIES: tuple[Severity, ...] = ("error", "warning", "info")
SECTIONS = ("Symptom", "Cause", "Quick check", "Fix")

# A section runs from its bold heading to the next bold heading or the end.
_SECTION = re.compile(r"\*\*(" + "|".join(SECTIONS) + r"):\*\*\s*(.*?)(?=\n\s*\*\*[A-Z][a-z ]+:\*\*|\Z)", re.S)

E = TypeVar("E", bound="Entry")


class Entry:
    """One rule or check: metadata as class attributes, docs from the docstring."""

    code: ClassVar[str]
    name: ClassVar[str]
    severity: ClassVar[Severity]

    @classmethod
    def docs(cls) -> dict[str, str]:
        """The summary and the sections of the docstring (keys `summary`, `symptom`,
        `cause`, `quick_check`, `fix`), parsed once per class."""
        sections = dict(doc_sections(cls.__doc__ or ""))
        if "fix" in sections:
            sections["fix"] = cls.fix_text()
        return sections

    @classmethod
    def fix_text(cls) -> str:
        """The **Fix:** section as a sentence of its own (first letter capitalised)."""
        fix = doc_sections(cls.__doc__ or "").get("fix", "")
        return fix[:1].upper() + fix[1:]


@cache
def doc_sections(doc: str) -> dict[str, str]:
    """The summary (the whole first paragraph, however it wraps) and the
    **Symptom:** / **Cause:** / **Quick check:** / **Fix:** sections of a docstring,
    each on one line. Callers get a copy through `Entry.docs`."""
    sections = {k.lower().replace(" ", "_"): " ".join(v.split()) for k, v in _SECTION.findall(doc)}
    return {"summary": " ".join(doc.strip().split("\n\n")[0].split()), **sections}


def discover(package: ModuleType, base: type[E]) -> list[type[E]]:
    """Every subclass of `base` with a code defined in a module of `package`, sorted
    by code; a code defined twice is an error. Modules whose name starts with an
    underscore hold helpers, not entries."""
    found: dict[str, type[E]] = {}
    for info in pkgutil.iter_modules(package.__path__):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{package.__name__}.{info.name}")
        for obj in vars(module).values():
            if (
                isinstance(obj, type)
                and issubclass(obj, base)
                and obj.__module__ == module.__name__
                and getattr(obj, "code", None)
            ):
                if obj.code in found:
                    raise RuntimeError(f"code {obj.code} defined twice: {found[obj.code].__name__}, {obj.__name__}")
                found[obj.code] = obj
    return [found[code] for code in sorted(found)]


class Registry(Generic[E]):
    """The entries of one package: every subclass of `base` defined in one of its
    modules, found on first use, sorted by code."""

    def __init__(self, package: str, base: type[E]) -> None:
        self.package = package
        self.base = base
        self._entries: tuple[type[E], ...] | None = None

    def all(self) -> list[type[E]]:
        """Every entry, sorted by code."""
        if self._entries is None:
            self._entries = tuple(discover(importlib.import_module(self.package), self.base))
        return list(self._entries)

    def get(self, code: str) -> type[E] | None:
        """The entry with this code (any case), or None."""
        return next((e for e in self.all() if e.code == code.upper()), None)


def fmt_ranks(ranks: Iterable[Any], limit: int = 12) -> str:
    """'rank 3', 'ranks 0, 1, 5-9': runs of three or more neighbours shortened, at
    most ``limit`` groups shown."""
    rs = sorted({int(r) for r in ranks})
    if not rs:
        return "no rank"
    groups: list[str] = []
    start = prev = rs[0]
    for r in [*rs[1:], None]:
        if r is not None and r == prev + 1:
            prev = r
            continue
        # A run of three or more is shortened; two neighbours are just listed.
        groups.extend(
            [str(start)] if start == prev else [str(start), str(prev)] if prev == start + 1 else [f"{start}-{prev}"]
        )
        if r is not None:
            start = prev = r
    more = f" (+{len(groups) - limit} more)" if len(groups) > limit else ""
    return ("rank " if len(rs) == 1 else "ranks ") + ", ".join(groups[:limit]) + more
