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
        if ev.records is not None and ev.records.snapshots:
            lines.append(
                "the probe attached, but no rank completed an update before the job stopped: parameters, "
                "gradients and optimizer state were never compared across ranks"
            )
        elif ev.losses.height or ev.events.all:
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
    lines.extend(stage_lines(ev))
    if loss_unobserved(ev):
        lines.append(
            "no rank's loss was recorded: a fault that changes what one rank optimizes while the "
            "parameters stay equal (a per-rank loss definition) cannot be seen; report it with "
            "`probe.loss(loss)` or run under `syncdoctor run`"
        )
    return lines


# What each stage's faults look like from elsewhere when the stage itself is not
# observed: the stages that stand in for it, any one of them ("a+b": both together).
# A stage with none observed: its faults cannot be seen.
STAGE_NAMES = {
    "params_start": "parameters at start",
    "data": "the batches",
    "modes": "train/eval modes",
    "loss": "the loss",
    "grads_local": "local gradients (before the reduce)",
    "reduce_settings": "the reducer's settings",
    "grads_reduced": "gradients after the reduce",
    "loss_scale": "the loss scale",
    "optimizer": "optimizer hyperparameters and state",
    "params": "parameters at checks",
    "loader_settings": "the loader's shard and seed settings",
}
_STANDS_IN = {
    # A reduce that differs by rank parts the parameters at the next check; one that sums
    # on every rank alike shows only in the reducer's settings or the measured ratio.
    "grads_local": ("reduce_settings", "params"),
    "grads_reduced": ("reduce_settings", "params"),
    "reduce_settings": ("grads_local+grads_reduced",),
    # The loader's shard and seed settings are in the snapshot (overlap, duplicate shards).
    "data": ("loader_settings",),
}


def stages(ev: Evidence) -> dict[str, tuple[bool | None, str]]:
    """stage -> (observed on every rank that says, how or why not) from the snapshots'
    `stages` (the MindSpore probe's, zero-code); empty where no snapshot says. A stage
    declared observed counts as unobserved where the step records hold none of it."""
    out: dict[str, tuple[bool | None, str]] = {}
    for snap in ev.snapshots.values():
        declared = snap.get("stages")
        if not isinstance(declared, dict):
            continue
        for name, value in declared.items():
            if not isinstance(value, dict):
                continue
            observed, how = value.get("observed"), str(value.get("how", ""))
            before = out.get(name)
            if before is None or (before[0] is not False and observed is False):
                out[name] = (observed, how)
    if not out:
        return out
    if any(isinstance(s.get("loader"), dict) and s["loader"].get("num_replicas") for s in ev.snapshots.values()):
        out["loader_settings"] = (True, "the loader's shard and seed settings, at start")
    if out.get("grads_reduced", (None, ""))[0] and not _column_has(ev, "grad_norm"):
        out["grads_reduced"] = (False, "declared observable, but no step record holds a gradient norm")
    if out.get("grads_local", (None, ""))[0] and not _column_has(ev, "grad_norm_local"):
        out["grads_local"] = (False, "declared observable, but no step record holds a local gradient norm")
    return out


def _column_has(ev: Evidence, column: str) -> bool:
    return ev.has_records and column in ev.steps.columns and ev.steps[column].null_count() < ev.steps.height


def stand_ins(ev: Evidence, name: str, seen: dict[str, tuple[bool | None, str]] | None = None) -> list[str]:
    """The observed stages (or groups of them, "a+b") that show a fault of stage `name`."""
    seen = stages(ev) if seen is None else seen
    return [s for s in _STANDS_IN.get(name, ()) if all(seen.get(p, (False, ""))[0] is True for p in s.split("+"))]


def unobserved_stages(ev: Evidence) -> list[tuple[str, str, list[str]]]:
    """(stage, why not, the observed stages that stand in for it) for every stage
    declared and not observed."""
    seen = stages(ev)
    return [(name, why, stand_ins(ev, name, seen)) for name, (observed, why) in seen.items() if observed is False]


def reduce_unobserved(ev: Evidence) -> bool:
    """Several ranks, and neither the reducer's settings nor the gradients around the
    reduce observed: a reduce that sums on every rank alike (the replicas stay equal)
    cannot be seen."""
    several = (ev.world_size or len(ev.ranks)) > 1
    return several and any(name == "reduce_settings" and not others for name, _, others in unobserved_stages(ev))


def stage_lines(ev: Evidence) -> list[str]:
    """One sentence per reason a stage could not be observed in this style (stages that
    share the reason and the stand-ins share the sentence), saying what stood in for
    them (the loss has its own sentence, from the records)."""
    groups: dict[tuple[str, tuple[str, ...]], list[str]] = {}
    for name, why, others in unobserved_stages(ev):
        if name != "loss":
            groups.setdefault((why, tuple(others)), []).append(STAGE_NAMES.get(name, name))
    lines = []
    for (why, stood_in), labels in groups.items():
        if stood_in:
            tail = "what stood in: " + " or ".join(
                " with ".join(STAGE_NAMES.get(p, p) for p in group.split("+")) for group in stood_in
            )
        else:
            tail = "nothing stood in: a fault there is not ruled out"
        lines.append(f"not observed: {' and '.join(labels)} ({why}); {tail}")
    return lines
