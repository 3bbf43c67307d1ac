"""Renderers of a :class:`~syncdoctor.doctor.model.Diagnosis`: terminal, JSON, HTML.

All three treat every string that came from a log or a record as hostile: escape
sequences and control characters are removed and the text is escaped for the
output format, never interpreted as markup.
"""

from syncdoctor.doctor.report import jupyter  # noqa: F401 # gives Diagnosis Jupyter's display hook
from syncdoctor.doctor.report.html import render_html
from syncdoctor.doctor.report.json_out import render_json
from syncdoctor.doctor.report.terminal import render_terminal

__all__ = ["render_html", "render_json", "render_terminal"]
