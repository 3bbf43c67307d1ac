"""Machine-readable output: the diagnosis as strict JSON."""

from __future__ import annotations

import json

from syncdoctor.doctor.model import Diagnosis
from syncdoctor.doctor.report.common import json_safe


def render_json(diag: Diagnosis, indent: int | None = 2, include_series: bool = False) -> str:
    """``diag.to_json()`` as strict JSON text.

    NaN and ±inf (a loss that blew up) become ``null`` because strict parsers
    (jq, JavaScript's JSON.parse, most other languages) reject the ``NaN`` token
    Python writes by default. Keys keep the dataclass field order, which is fixed,
    and the per-rank series are ordered by rank number, so two runs over the same
    input give byte-identical output.
    """
    data = diag.to_json(include_series=include_series)
    for key in ("loss_series", "grad_norm_series"):
        if key in data:
            data[key] = {k: data[key][k] for k in sorted(data[key], key=_rank_key)}
    return json.dumps(json_safe(data), indent=indent, ensure_ascii=False, allow_nan=False)


def _rank_key(key: str) -> tuple[int, int | str]:
    try:
        return (0, int(key))
    except ValueError:
        return (1, key)
