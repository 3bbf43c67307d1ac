"""The rule base class. A rule is one small unit: a stable code, a category, a
docstring whose **Symptom:**, **Cause:** and **Fix:** sections are its docs, and one
`evaluate` method that reads the Evidence and returns a Finding or None."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any, ClassVar

from syncdoctor.doctor.model import Finding, Severity

if TYPE_CHECKING:
    from syncdoctor.doctor.evidence import Evidence

_SECTION = re.compile(r"\*\*(Symptom|Cause|Fix|Quick check):\*\*\s*(.*?)(?=\n\s*\*\*[A-Z][a-z ]+:\*\*|\Z)", re.S)


class Rule:
    code: ClassVar[str]
    name: ClassVar[str]
    category: ClassVar[str]
    severity: ClassVar[Severity] = "error"
    title: ClassVar[str]
    fix: ClassVar[str]
    # What the rule can work from: "records" (probe records), "logs" (raw logs).
    sources: ClassVar[tuple[str, ...]] = ("records",)

    def evaluate(self, ev: Evidence) -> Finding | None:
        raise NotImplementedError

    def found(self, confidence: float, evidence: list[str], *, ranks: list[int] | None = None,
              step: int | None = None, tensor: str | None = None, title: str | None = None,
              severity: Severity | None = None, direct: bool = False) -> Finding:
        return Finding(code=self.code, category=self.category, severity=severity or self.severity,
                       confidence=round(max(0.0, min(1.0, confidence)), 2), title=title or self.title,
                       ranks=sorted(ranks or []), step=step, tensor=tensor, evidence=evidence, fix=self.fix,
                       direct=direct)

    @classmethod
    def docs(cls) -> dict[str, Any]:
        return {"code": cls.code, "name": cls.name, "category": cls.category, "severity": cls.severity,
                "title": cls.title, "sources": list(cls.sources), **doc_sections(cls.__doc__), "fix": cls.fix}


def doc_sections(doc: str | None) -> dict[str, str]:
    """The summary line and the **Symptom:** / **Cause:** / **Quick check:** / **Fix:**
    sections of a rule's or check's docstring: its documentation."""
    doc = doc or ""
    sections = {k.lower().replace(" ", "_"): " ".join(v.split()) for k, v in _SECTION.findall(doc)}
    # The summary is the whole first paragraph, however the docstring wraps it.
    return {"summary": " ".join(doc.strip().split("\n\n")[0].split()), **sections}


def fmt_ranks(ranks: list[int] | set[int]) -> str:
    ranks = sorted(ranks)
    return "rank " + str(ranks[0]) if len(ranks) == 1 else "ranks " + ", ".join(map(str, ranks))
