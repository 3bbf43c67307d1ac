"""What ran, from the probe snapshots: the report's "Run" lines.

Provenance a reader needs to trust (or question) a diagnosis and to match it to other
logs: the framework, how the probe attached, how the training loop was reached, what
fed the data, and each rank's host and process id (the id the kernel's OOM killer and
the launcher's logs name). Printed as the probe wrote it (the report cleans the text).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from syncdoctor.doctor.evidence import Evidence

MAX_PROCESSES = 16  # processes listed by name; beyond that, a count


def run_facts(ev: Evidence) -> dict[str, str]:
    """Ordered facts about the run ("framework": "torch", ...); empty without snapshots."""
    snaps = {r: s for r, s in sorted(ev.snapshots.items()) if isinstance(s, dict)}
    if not snaps:
        return {}
    facts: dict[str, str] = {}
    _put(facts, "framework", _common(s.get("framework") for s in snaps.values()))
    attach = _common(s.get("auto") for s in snaps.values())
    if attach:
        facts["attach"] = "zero-code (syncdoctor run)" if attach == "True" else "in the training script"
    _put(facts, "training loop", _common(s.get("style") for s in snaps.values()))
    loaders = [loader for s in snaps.values() if isinstance(loader := s.get("loader"), dict)]
    _put(facts, "loader", _common(_loader_line(loader) for loader in loaders))
    segments = max((n for s in snaps.values() if isinstance(n := s.get("segment"), int)), default=1)
    if segments > 1:
        facts["rebuilt"] = (
            f"the model was rebuilt in the process ({segments} segments of one record per rank; steps go on counting)"
        )
    processes = [f"rank {r}: {s.get('host') or '?'} pid {s.get('pid')}" for r, s in snaps.items() if s.get("pid")]
    if processes:
        shown = processes[:MAX_PROCESSES]
        more = len(processes) - len(shown)
        facts["processes"] = "; ".join(shown) + (f"; and {more} more" if more else "")
    return facts


def _loader_line(loader: dict[str, Any]) -> str | None:
    parts = [str(loader[k]) for k in ("type", "sampler") if loader.get(k)]
    pipeline = loader.get("pipeline")
    if isinstance(pipeline, list) and pipeline:
        parts.append(" <- ".join(str(op) for op in pipeline))
    return " / ".join(parts) or None


def _common(values: Any) -> str | None:
    """One value, or each value with how many ranks hold it when they differ."""
    seen = Counter(str(v) for v in values if v is not None)
    if not seen:
        return None
    if len(seen) == 1:
        return next(iter(seen))
    return ", ".join(f"{v} ({n} ranks)" for v, n in seen.most_common())


def _put(facts: dict[str, str], key: str, value: str | None) -> None:
    if value:
        facts[key] = value
