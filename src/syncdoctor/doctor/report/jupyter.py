"""Jupyter's display hook: a notebook shows a :class:`Diagnosis` as its report (the
HTML fragment, static SVG charts, no script).

model.py stays plain data: the hook is set on the class here, and this module is
imported by doctor/diagnose.py, which every diagnosis comes from.
"""

from __future__ import annotations

from syncdoctor.doctor.model import Diagnosis
from syncdoctor.doctor.report.html import render_fragment


def repr_html(diag: Diagnosis) -> str:
    """What Jupyter shows for a diagnosis: the report without the page around it."""
    return render_fragment(diag)


def install() -> None:
    """Give :class:`Diagnosis` its ``_repr_html_`` (idempotent)."""
    setattr(Diagnosis, "_repr_html_", repr_html)  # noqa: B010 # a hook set from outside the class


install()
