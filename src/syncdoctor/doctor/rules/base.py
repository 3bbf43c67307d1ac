"""The rule base class. A rule is one small unit: a stable code, a category, a
docstring whose **Symptom:**, **Cause:**, **Quick check:** and **Fix:** sections are
its docs (the Fix section is the fix a finding carries), and one `evaluate` method
that reads the Evidence and returns a Finding or None."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from syncdoctor.doctor.model import Finding
from syncdoctor.records.contract import int64_or_none
from syncdoctor.rulebook import Entry, Severity

if TYPE_CHECKING:
    from syncdoctor.doctor.evidence import Evidence


class Rule(Entry):
    category: ClassVar[str]
    severity: ClassVar[Severity] = "error"
    title: ClassVar[str]
    # What the rule can work from: "records" (probe records with steps), "ends" (the
    # probe's end records alone: a job that stopped before its first update), "logs"
    # (raw logs).
    sources: ClassVar[tuple[str, ...]] = ("records",)
    # The stage of the data-parallel contract it tests (records/stages.py: a stage's key,
    # or what lies outside one step's dataflow); every rule names one.
    stage: ClassVar[str]

    def evaluate(self, ev: Evidence) -> Finding | None:
        raise NotImplementedError

    def found(
        self,
        confidence: float,
        evidence: list[str],
        *,
        ranks: list[int] | None = None,
        step: int | None = None,
        tensor: str | None = None,
        title: str | None = None,
        severity: Severity | None = None,
        direct: bool = False,
    ) -> Finding:
        # A step or rank read off a log line is as long as its digits: past int64 it is no step.
        return Finding(
            code=self.code,
            category=self.category,
            severity=severity or self.severity,
            confidence=round(max(0.0, min(1.0, confidence)), 2),
            title=title or self.title,
            ranks=sorted(r for r in ranks or [] if int64_or_none(r) is not None),
            step=int64_or_none(step),
            tensor=tensor,
            evidence=evidence,
            fix=self.fix_text(),
            direct=direct,
            stage=self.stage,
        )

    @classmethod
    def docs(cls) -> dict[str, Any]:
        return {
            "code": cls.code,
            "name": cls.name,
            "category": cls.category,
            "severity": cls.severity,
            "title": cls.title,
            "sources": list(cls.sources),
            "stage": cls.stage,
            **super().docs(),
        }
