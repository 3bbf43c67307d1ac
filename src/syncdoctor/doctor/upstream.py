"""What held upstream of the cause: for the top finding's stage (records/stages.py),
the earlier stages of the contract compared across ranks at the last check step at or
before the finding's step, so the finding says what it ruled out ("gradients equal
right after the all-reduce at step 50") and what it could not see, instead of
leaving the reader to assume the rest was fine.

Only plain data parallelism: under a sharded or hybrid layout the fingerprints are
compared within replica groups (ev.fingerprints), not across all ranks.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import polars as pl

from syncdoctor.records import stages

if TYPE_CHECKING:
    from syncdoctor.doctor.evidence import Evidence
    from syncdoctor.doctor.model import Finding

# stage -> the step columns that show it, each with what healthy data parallelism
# keeps: "equal" on every rank, or "differ" (every rank reads its own batches). A
# column the probe leaves out when it holds the usual value (syncs, uncovered_grads,
# overflow) is left out here too: absent, it cannot tell "usual" from "not observed".
COMPARED: dict[str, tuple[tuple[str, str], ...]] = {
    "data": (("data_fp", "differ"),),
    "forward": (("train_mode", "equal"), ("buffer_fp", "equal")),
    "backward": (("grads_missing", "equal"),),
    "sync_schedule": (("micro", "equal"), ("opt_steps", "equal")),
    "loss_scale": (("loss_scale", "equal"),),
    "reduced": (("grad_reduced_fp", "equal"),),
    "grads_at_update": (("grad_writes", "equal"), ("grad_fp", "equal")),
    "optimizer": (("lr", "equal"), ("opt_fp", "equal"), ("config_fp", "equal")),
    "params": (("param_fp", "equal"),),
}


def _check_step(ev: Evidence, step: int) -> pl.DataFrame | None:
    """The rows of the last step at or before `step` at which every rank recorded its
    parameters' fingerprint (a check step)."""
    frame = ev.steps
    if "param_fp" not in frame.columns or not ev.ranks:
        return None
    checked = (
        frame.filter(pl.col("param_fp").is_not_null() & (pl.col("step") <= step))
        .group_by("step")
        .agg(pl.col("rank").n_unique().alias("n"))
        .filter(pl.col("n") >= len(ev.ranks))
    )
    if checked.height == 0:
        return None
    at = int(checked["step"].max())  # type: ignore[arg-type]
    return frame.filter(pl.col("step") == at).unique("rank", keep="last")


def _held(rows: pl.DataFrame, column: str, keeps: str) -> bool | None:
    """Whether the ranks kept `column` as healthy data parallelism does; None: not
    observed on every rank at that step."""
    if column not in rows.columns:
        return None
    values = rows[column]
    if values.null_count():
        return None
    distinct = values.n_unique()
    return distinct == 1 if keeps == "equal" else distinct == rows.height


def upstream_line(ev: Evidence, finding: Finding) -> str | None:
    """One evidence line: the stages before the finding's that held at the check step,
    those that were broken there too, and those not observed there."""
    if finding.step is None or stages.order(finding.stage) >= len(stages.STAGES) or ev.placement.replica:
        return None
    rows = _check_step(ev, finding.step)
    if rows is None or rows.height < 2:
        return None
    step = int(rows["step"][0])
    held, broken, unseen = [], [], []
    for stage in stages.STAGES[: stages.order(finding.stage)]:
        outcomes = {column: _held(rows, column, keeps) for column, keeps in COMPARED.get(stage.key, ())}
        if not outcomes:
            continue
        seen = {c: ok for c, ok in outcomes.items() if ok is not None}
        if not seen:
            unseen.append(stage.name)
        elif all(seen.values()):
            held.append(f"{stage.name} ({', '.join(seen)})")
        else:
            broken.append(f"{stage.name} ({', '.join(c for c, ok in seen.items() if not ok)})")
    if not (held or broken):
        return None
    parts = []
    if held:
        parts.append(f"held on every rank: {'; '.join(held)}")
    if broken:
        parts.append(f"also apart at that step: {'; '.join(broken)}")
    if unseen:
        parts.append(f"not observed: {', '.join(unseen)}")
    return f"upstream of the {stages.name(finding.stage)}, at the check of step {step}: " + " — ".join(parts)
