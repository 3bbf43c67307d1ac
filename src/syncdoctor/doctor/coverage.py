"""What the diagnosis actually covered: which steps the replicas were compared at, which
ran after the last comparison, and which stages of the step nothing observed.

A verdict of health is a statement about what was checked. A run of 84 steps with one
check block (steps 1-50) says nothing about steps 51-84, and a run whose records hold
no loss cannot show a fault that changes what one rank optimizes while its parameters
stay equal (a per-rank loss definition: the gradients are averaged all the same). Each
such gap is one plain sentence beside the verdict, in every report.
"""

from __future__ import annotations

import polars as pl

from syncdoctor.doctor.evidence import Evidence
from syncdoctor.records import contract


def compared_steps(ev: Evidence) -> list[int]:
    """Steps at which two or more ranks fingerprinted their parameters, and the step
    the probe compared once more at close (a check record after the last of those)."""
    if not ev.has_records:
        return []
    steps: set[int] = set()
    if "param_fp" in ev.steps.columns:
        counted = (
            ev.steps.filter(pl.col("param_fp").is_not_null())
            .group_by("step")
            .agg(pl.len().alias("n"))
            .filter(pl.col("n") > 1)
        )
        steps.update(int(s) for s in counted["step"].to_list())
    read = [c["step"] for c in ev.checks if c.get("status") in ("ok", "mismatch") and isinstance(c.get("step"), int)]
    if read and (not steps or max(read) > max(steps)):
        steps.add(max(read))  # the check at close: compared, though no step record holds it
    return sorted(steps)


def _close_check_messages(ev: Evidence) -> list[str]:
    events = ev.records.events if ev.records is not None else []
    return [str(e.get("message", "")) for e in events if e.get("event") == contract.CLOSE_CHECK_EVENT]


def last_step(ev: Evidence) -> int | None:
    """The last step any rank recorded."""
    if not ev.has_records:
        return None
    value = ev.steps["step"].max()
    return int(value) if isinstance(value, (int, float)) else None


def loss_unobserved(ev: Evidence) -> bool:
    """Probe records of several ranks, and not one loss among them or in the logs."""
    several = (ev.world_size or len(ev.ranks)) > 1
    return ev.has_records and several and not ev.losses.height


def coverage(ev: Evidence) -> list[str]:
    """The sentences that say what was and was not covered (empty: nothing to say)."""
    lines: list[str] = []
    if not ev.has_records:
        if ev.losses.height or ev.events.all:
            lines.append(
                "from logs only: parameters, gradients and optimizer state were not compared across ranks "
                "(run under `syncdoctor run` to compare them)"
            )
        return lines
    checked = compared_steps(ev)
    end = last_step(ev)
    several = (ev.world_size or len(ev.ranks)) > 1
    if several and not checked:
        lines.append("no check compared the replicas: no step was fingerprinted on two or more ranks")
    elif checked:
        plural = "s" if len(checked) > 1 else ""
        span = f"step {checked[0]}" if len(checked) == 1 else f"steps {checked[0]}-{checked[-1]}"
        lines.append(f"replicas compared at {len(checked)} check{plural}, {span}")
        if end is not None and end > checked[-1]:
            why = next((m for m in _close_check_messages(ev) if m.startswith(contract.NOT_COMPARED_AT_CLOSE)), "")
            lines.append(
                f"steps {checked[-1] + 1}-{end} ran after the last check and were not compared: "
                "what is said here of the replicas covers the run up to step "
                f"{checked[-1]}"
                + (
                    f" ({why.removeprefix(contract.NOT_COMPARED_AT_CLOSE)})"
                    if why
                    else " (a smaller --check-every covers more)"
                )
            )
    if loss_unobserved(ev):
        lines.append(
            "no rank's loss was recorded: a fault that changes what one rank optimizes while the "
            "parameters stay equal (a per-rank loss definition) cannot be seen; report it with "
            "`probe.loss(loss)` or run under `syncdoctor run`"
        )
    return lines
