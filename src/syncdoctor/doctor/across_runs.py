"""Several probe run folders at once: each diagnosed on its own, then what they share.

Silent hardware corruption is rare in any one run and recurs where the faulty chip
is. A run with three or more ranks names the odd replica's host and device; a run
with two names both ranks as candidates. Counted over runs, the host (and device)
that comes up again is the one to take out of the pool.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from syncdoctor.doctor.model import Diagnosis

SCHEMA = "syncdoctor.diagnosis-runs/1"
CORRUPTION = "hardware.corruption"


@dataclass
class RunDiagnosis:
    path: str
    diagnosis: Diagnosis
    # Where a hardware.corruption finding points: {"rank", "host", "device", "named"} (named:
    # the odd replica of a strict majority; False: one of several candidates).
    suspects: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class HostCount:
    host: str
    named: int  # runs in which a replica on it was the odd one out
    candidate: int  # runs in which it was one of the candidates (no majority)
    devices: dict[str, int]  # device -> runs
    where: list[str]  # "RUN: rank R at step S"


def diagnose_runs(
    groups: Sequence[Sequence[str | Path]], baseline: Sequence[str | Path] | None = None
) -> list[RunDiagnosis]:
    """Diagnose each group of paths (one run folder, or the loose logs) on its own,
    each against ``baseline`` when one is given."""
    from syncdoctor.doctor.diagnose import diagnose_evidence, load_baseline, load_evidence
    from syncdoctor.doctor.rules.sd971_silent_corruption import device_of

    out = []
    for paths in groups:
        ev = load_evidence(paths)
        if baseline:
            load_baseline(ev, baseline)
        diag = diagnose_evidence(ev)
        suspects = []
        for finding in diag.findings:
            if finding.category != CORRUPTION:
                continue
            world = ev.world_size or len(ev.ranks)
            named = bool(finding.ranks) and 2 * len(finding.ranks) < world
            suspects += [{**device_of(ev, r), "named": named, "step": finding.step} for r in finding.ranks]
        out.append(RunDiagnosis(", ".join(map(str, paths)), diag, suspects))
    return out


def recurring_hosts(runs: list[RunDiagnosis]) -> list[HostCount]:
    """Hosts named by hardware.corruption findings, most runs first."""
    counts: dict[str, HostCount] = {}
    for run in runs:
        hosts_here: dict[str, dict[str, Any]] = {}
        for s in run.suspects:
            host = s.get("host") or "unknown host"
            entry = hosts_here.setdefault(host, {"named": False, "devices": set(), "ranks": []})
            entry["named"] |= bool(s["named"])
            if s.get("device"):
                entry["devices"].add(s["device"])
            entry["ranks"].append((s["rank"], s.get("step")))
        for host, entry in hosts_here.items():
            count = counts.setdefault(host, HostCount(host, 0, 0, {}, []))
            if entry["named"]:
                count.named += 1
            else:
                count.candidate += 1
            for device in entry["devices"]:
                count.devices[device] = count.devices.get(device, 0) + 1
            count.where += [
                f"{run.path}: rank {r}" + (f" at step {st}" if st is not None else "") for r, st in entry["ranks"]
            ]
    return sorted(counts.values(), key=lambda c: (-c.named, -(c.named + c.candidate), c.host))


def summary_lines(runs: list[RunDiagnosis]) -> list[str]:
    """The cross-run summary, one line each."""
    lines = [
        f"{len(runs)} runs diagnosed, each on its own: "
        + "; ".join(
            f"{run.path}: {run.diagnosis.verdict}"
            + (f" ({run.diagnosis.findings[0].category})" if run.diagnosis.findings else "")
            for run in runs
        )
    ]
    hosts = recurring_hosts(runs)
    with_corruption = sum(1 for run in runs if run.suspects)
    if not hosts:
        lines.append("no run shows silent hardware corruption")
        return lines
    lines.append(f"{with_corruption} of {len(runs)} runs show silent hardware corruption")
    top = hosts[0]
    recurs = top.named + top.candidate >= 2 and (
        top.named >= 2 or len(hosts) == 1 or top.named + top.candidate > hosts[1].named + hosts[1].candidate
    )
    for h in hosts[:8]:
        devices = ", ".join(f"{d} ({n} runs)" for d, n in sorted(h.devices.items(), key=lambda kv: -kv[1]))
        lines.append(
            f"host {h.host}: the odd replica in {h.named} run(s), a candidate in {h.candidate}"
            + (f"; devices: {devices}" if devices else "")
            + "; "
            + "; ".join(h.where[:4])
        )
    if recurs:
        device = max(top.devices.items(), key=lambda kv: kv[1]) if top.devices else None
        lines.append(
            f"recurring: host {top.host}"
            + (f", {device[0]}" if device and device[1] >= 2 else "")
            + f" — named in {top.named + top.candidate} of {with_corruption} runs with corruption: "
            "take it out of the pool and run the vendor's diagnostics on it"
        )
    else:
        lines.append("no host recurs yet: one corrupted run does not single out a host")
    return lines


def render_json(runs: list[RunDiagnosis]) -> str:
    from syncdoctor.doctor.report.common import json_safe

    data = {
        "schema": SCHEMA,
        "runs": [{"path": r.path, "suspects": r.suspects, "diagnosis": r.diagnosis.to_json()} for r in runs],
        "across_runs": {"hosts": [vars(h) for h in recurring_hosts(runs)], "summary": summary_lines(runs)},
    }
    return json.dumps(json_safe(data), indent=2, ensure_ascii=False, allow_nan=False)


def render_terminal(runs: list[RunDiagnosis]) -> None:
    from rich.console import Console
    from rich.panel import Panel
    from rich.text import Text

    from syncdoctor.doctor.report import render_terminal as render_one
    from syncdoctor.doctor.report.common import clean

    console = Console()
    for i, run in enumerate(runs, 1):
        console.rule(Text(f"run {i}/{len(runs)}: {clean(run.path, oneline=True)}"))
        render_one(run.diagnosis, console)
    body = Text("\n".join(clean(line, oneline=True) for line in summary_lines(runs)))
    console.print(Panel(body, title="Across runs"))
