"""From paths (probe run folders, logs, folders of logs) to a ranked Diagnosis."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import polars as pl

from syncdoctor.doctor.calibration import calibrated
from syncdoctor.doctor.coverage import coverage, loss_unobserved, reduce_unobserved
from syncdoctor.doctor.evidence import Evidence
from syncdoctor.doctor.model import AgreementSpan, Diagnosis, Finding, RankSummary, Verdict
from syncdoctor.doctor.report import jupyter  # noqa: F401 # gives Diagnosis Jupyter's display hook
from syncdoctor.doctor.rules import all_rules
from syncdoctor.doctor.run_facts import run_facts
from syncdoctor.doctor.series import downsample
from syncdoctor.doctor.upstream import upstream_line
from syncdoctor.errors import InputError
from syncdoctor.records import RecordError, read_run, stages
from syncdoctor.records.reader import is_run_dir
from syncdoctor.rulebook import SEVERITIES

RUN_META = "run.json"  # what `syncdoctor run` writes first in its folder (probe/run/launcher.py)
# Categories that say "not the collaboration between cards".
NOT_SYNC = {"healthy", "train.divergence", "hparam.lr_scaling", "config.launch"}
_SEVERITY_ORDER = {s: i for i, s in enumerate(SEVERITIES)}
MAX_MISSING_ROWS = 1024  # absent ranks listed one row each; more become one warning


def load_evidence(paths: Sequence[str | Path]) -> Evidence:
    from syncdoctor.doctor.ingest import ingest_logs

    warnings: list[str] = []
    records = None
    for raw in paths:
        path = Path(raw)
        if not path.exists():
            raise InputError(f"{path}: no such file or folder")
        if path.is_dir() and is_run_dir(path):
            if records is not None:
                warnings.append(f"{path}: only the first run folder's records are used")
                continue
            try:
                records = read_run(path)
            except RecordError as exc:
                if "schema version" in str(exc):
                    raise InputError(str(exc)) from exc
                warnings.append(str(exc))
    # A `syncdoctor run` folder in which no rank attached holds no records and no rank
    # logs: that is what was observed (nothing), an inconclusive diagnosis, not bad input.
    unattached = [Path(p) for p in paths if Path(p).is_dir() and (Path(p) / RUN_META).is_file()]
    try:
        logs = ingest_logs([Path(p) for p in paths])
    except InputError:
        if records is None and not unattached:
            raise
        logs = None
    if records is None and (logs is None or not logs.n_lines) and unattached:
        warnings.append(
            f"{unattached[0]}: a `syncdoctor run` folder in which no rank attached, so nothing was recorded: no "
            "process of the command started a process group or took an optimizer step as a rank (a launcher "
            "that starts one process, such as `accelerate launch --cpu`, or a run that ended before its first "
            "step); nothing here says whether training was healthy"
        )
        return Evidence(records=None, logs=None, warnings=warnings)
    # A log with no loss and no event is still a log: the doctor says what it holds
    # and what would tell (SD991, inconclusive). Only input with no text is an error.
    if records is None and (logs is None or not logs.n_lines):
        raise InputError(
            "nothing to diagnose: no probe records and no log lines (empty files) in " + ", ".join(map(str, paths))
        )
    return Evidence(records=records, logs=logs, warnings=warnings)


def run_rules(ev: Evidence, *, calibrate: bool = True) -> list[Finding]:
    """Every rule's finding, ranked; with ``calibrate``, each confidence is the one
    measured for its rule (doctor/calibration.py), else the rule's own estimate."""
    findings = []
    for rule_cls in all_rules():
        rule = rule_cls()
        if (
            not ev.has_records
            and "logs" not in rule.sources
            and not (ev.records is not None and "ends" in rule.sources)
        ):
            continue
        try:
            finding = rule.evaluate(ev)
        except Exception as exc:  # one broken rule must not cost the whole diagnosis
            ev.warnings.append(f"rule {rule.code} failed on this input: {type(exc).__name__}: {exc}")
            continue
        if finding is not None:
            findings.append(calibrated(finding) if calibrate else finding)
    return ranked(findings)


def ranked(findings: list[Finding]) -> list[Finding]:
    """Most severe first, then most likely; of equally likely causes, the one observed,
    then the one earliest in the step's dataflow (records/stages.py): every stage
    after a broken one differs too."""
    return sorted(
        findings,
        key=lambda f: (_SEVERITY_ORDER[f.severity], -f.confidence, not f.direct, stages.order(f.stage), f.code),
    )


def verdict_for(ev: Evidence, findings: list[Finding]) -> Verdict:
    """The most likely root cause decides: findings are already ranked."""
    serious = [f for f in findings if f.severity in ("error", "warning")]
    if serious:
        return "not_sync_problem" if serious[0].category in NOT_SYNC else "sync_problem"
    if ev.events.probe_disabled:
        return "inconclusive"  # a rank went unwatched: its silence proves nothing
    if loss_unobserved(ev):
        return "inconclusive"  # equal parameters do not show what each rank optimized
    if reduce_unobserved(ev):
        return "inconclusive"  # equal parameters do not show a reduce that sums on every rank
    checked = any(c.get("status") == "ok" for c in ev.checks)
    several_ranks = ev.losses.height > 0 and ev.losses["rank"].n_unique() > 1
    if (ev.has_records and (checked or len(ev.ranks) == 1)) or several_ranks:
        return "healthy"
    return "inconclusive"


def _alone_in_reduce(ev: Evidence, since: int) -> dict[int, int]:
    """Ranks whose gradient came out of the reduction equal to their own (ratio 1.0)
    at a detailed step from ``since`` on, in a job of several ranks: the first such
    step per rank. Averaging with anyone changes the norm."""
    if not ev.has_records or "reduce_ratio" not in ev.steps.columns or (ev.world_size or 1) < 2:
        return {}
    rows = ev.steps.filter((pl.col("step") >= since) & ((pl.col("reduce_ratio") - 1).abs() < 1e-6))
    agg = rows.group_by("rank").agg(pl.col("step").min())
    return {int(r): int(s) for r, s in agg.iter_rows()}


def _rank_status(
    rank: int,
    ev: Evidence,
    failed: dict[int, str],
    alone: dict[int, int],
    odd: set[int],
    blamed: set[int],
    div_step: int | None,
    last_step: int | None,
) -> tuple[str, str]:
    """(status, note) for one rank that left data: what the evidence says about it.
    ``blamed``: the ranks that stand out by themselves (outside a strict majority, or
    with a communication event of their own before the divergence)."""
    steps = ev.step_counts.get(rank)
    if rank in failed:
        return "crashed", failed[rank]
    if rank in ev.events.ended_early or (steps is not None and last_step is not None and steps < last_step):
        return "ended early", f"last step {steps} of {last_step}" if steps is not None else ""
    if rank in alone:
        note = (
            f"from step {alone[rank]} its reduced gradient equals its own (ratio 1.0): "
            "it was averaged with no other rank"
        )
        if rank in blamed or not blamed:
            return "left out of the average", note
        return "not averaged", note
    if rank in odd:
        note = f"its parameters differ from step {div_step}"
        if rank in blamed:
            return "odd one out", note
        return "disagrees", note + " (no majority says which side is right)"
    return "ok", ""


def rank_summaries(ev: Evidence) -> list[RankSummary]:
    out = []
    stats = {}
    if ev.losses.height:
        agg = (
            ev.losses.sort("step")
            .group_by("rank")
            .agg(pl.col("loss").last().alias("last"), pl.col("loss").mean().alias("mean"))
        )
        stats = {int(r): (last, mean) for r, last, mean in agg.iter_rows() if r is not None}
    norms = {}
    if ev.has_records:
        # Each rank's own gradient (before the reduction) where measured: the reduced
        # one is the same on every healthy rank.
        column = _grad_norm_column(ev)
        agg = ev.steps.group_by("rank").agg(pl.col(column).median())
        norms = {int(r): n for r, n in agg.iter_rows()}
    failed: dict[int, str] = {}
    for e in ev.events.of("crash", "oom", "exception"):
        if e.rank is not None:
            failed.setdefault(int(e.rank), f"{e.kind}: {e.raw[:160]}")
    if ev.records is not None:
        for rank, end in ev.records.ends.items():
            if end.get("status") == "exception":
                failed.setdefault(int(rank), f"exited on an exception: {str(end.get('message', ''))[:160]}")
    div = ev.replicas.divergence
    odd = set(div.ranks) if div else set()
    alone = _alone_in_reduce(ev, div.step) if div else {}
    world = ev.world_size or len(ev.ranks)
    blamed = odd if len(odd) * 2 < world else set()  # a strict majority stands against them
    if div is not None and not blamed:
        # Without a majority, a rank with a communication trouble of its own just
        # before the parting is the one the average lost.
        blamed = {
            int(e.rank)
            for e in ev.events.of("timeout", "retry", "watchdog", "network")
            if e.rank is not None and (e.step is None or e.step <= div.step)
        } & (odd | set(alone))
    last_step = max(ev.step_counts.values()) if ev.step_counts else None
    expected = range(ev.world_size) if ev.world_size else ev.ranks
    present = set(ev.ranks)
    absent = len(expected) - len(present.intersection(expected))
    if absent > MAX_MISSING_ROWS:
        # One stray rank99999.log must not turn the report into 100,000 "missing" rows.
        ev.warnings.append(
            f"{absent} of {len(expected)} ranks left no records or loss lines; "
            f"only the {len(present)} that did are listed"
        )
        expected = ev.ranks
    for rank in expected:
        last, mean = stats.get(rank, (None, None))
        if rank not in present:
            status, note = "missing", ""
        else:
            status, note = _rank_status(rank, ev, failed, alone, odd, blamed, div.step if div else None, last_step)
        out.append(
            RankSummary(
                rank=rank,
                steps=ev.step_counts.get(rank),
                last_loss=last,
                mean_loss=mean,
                grad_norm=norms.get(rank),
                status=status,
                note=note,
            )
        )
    return out


def _grad_norm_column(ev: Evidence) -> str:
    steps = ev.steps
    if "grad_norm_local" in steps.columns and steps["grad_norm_local"].null_count() < steps.height:
        return "grad_norm_local"
    return "grad_norm"


SERIES_POINTS = 2000  # per rank, for the plots: each bucket keeps its min and max, so spikes survive


def _series(frame: pl.DataFrame, value: str) -> dict[int, list[list[float]]]:
    if not frame.height or value not in frame.columns:
        return {}
    frame = frame.filter(pl.col(value).is_not_null() & pl.col("rank").is_not_null())
    out: dict[int, list[list[float]]] = {}
    for (rank,), part in frame.sort("rank", "step").group_by("rank", maintain_order=True):
        steps, values = downsample(
            part["step"].cast(pl.Float64).to_numpy(), part[value].cast(pl.Float64).to_numpy(), SERIES_POINTS
        )
        out[int(rank)] = np.column_stack([steps, values]).tolist()
    return out


def _unchecked(ev: Evidence) -> list[str]:
    """What the records could not show, said first among the warnings."""
    out = []
    disabled = ev.events.probe_disabled
    if disabled:
        step, message = next(iter(disabled.values()))
        out.append(
            f"the probe disabled itself on {len(disabled)} of {len(ev.ranks)} ranks "
            f"(ranks {sorted(disabled)[:16]}, first at step {step}: {message[:200]}); "
            "from then on those replicas were not checked, so no verdict of health can be given"
        )
    return out


def _in_mesh_terms(ev: Evidence, findings: list[Finding]) -> None:
    """Under a device mesh, the findings that explain the divergence say which replica
    group parted, in the mesh's own words: `replica group (ranks 1, 3), shard 1`."""
    div = ev.replicas.divergence
    mesh = ev.placement.mesh
    if div is None or mesh is None:
        return
    from syncdoctor.probe.core.mesh import group_name

    groups = div.detail.get("groups") or []
    lines = []
    for group in groups[:4]:
        what = "/".join(group.get("what") or div.what)
        tensor = f" `{div.tensor}`" if div.tensor else ""
        lines.append(
            f"in {group_name(group.get('dims') or [], group.get('members') or [], mesh)}: "
            f"{what}{tensor} differs from step {div.step}"
        )
    for finding in findings:
        if lines and finding.step == div.step and set(finding.ranks) & set(div.ranks):
            finding.evidence[:0] = lines


def load_baseline(run: Evidence, baseline: Sequence[str | Path]) -> None:
    """Read the baseline run and set ``run.baseline`` to the comparison (before the
    rules run: SD105 reads it). Bad baseline input is an InputError naming the baseline."""
    from syncdoctor.doctor.baseline import compare

    try:
        base = load_evidence(baseline)
    except InputError as exc:
        raise InputError(f"--baseline: {exc}") from exc
    if not base.losses.height:
        raise InputError("--baseline: no training loss found in " + ", ".join(map(str, baseline)))
    if not run.losses.height:
        run.warnings.append("--baseline: this run has no training loss to compare with the baseline")
        return
    run.baseline = compare(run, base, ", ".join(map(str, baseline)))


def _with_baseline(ev: Evidence, diag: Diagnosis) -> None:
    """The baseline's word on the ranking: a run worse than a healthy baseline with no
    cause found is no longer 'healthy'; the top cause gains the comparison as evidence."""
    cmp = ev.baseline
    diag.baseline = cmp
    if cmp is None:
        return
    if cmp.verdict == "parallel_part":
        line = f"baseline {cmp.path}: {cmp.summary}"
        if diag.findings and diag.findings[0].category not in NOT_SYNC:
            diag.findings[0].evidence.append(line)
        elif diag.verdict == "healthy":
            diag.verdict = "inconclusive"
            diag.warnings.insert(
                0, f"{line} — yet no sync cause was found: run under `syncdoctor run` with checks to find it"
            )


def _say_what_held_upstream(ev: Evidence, findings: list[Finding]) -> None:
    """The cause's finding says which earlier stages of the step it saw hold, and which
    it could not see (doctor/upstream.py)."""
    top = findings[0] if findings else None
    if top is not None and top.severity == "error":
        line = upstream_line(ev, top)
        if line:
            top.evidence.append(line)


def diagnose_evidence(ev: Evidence) -> Diagnosis:
    findings = run_rules(ev)
    _in_mesh_terms(ev, findings)
    _say_what_held_upstream(ev, findings)
    ev.warnings[:0] = _unchecked(ev)
    div = ev.replicas.divergence
    if div is not None and set(div.what) <= {"counter"} and not any(odd for _, odd in ev.agreement.per_check):
        div = None  # counters apart and the parameters equal at every check: the replicas never parted
    diag = Diagnosis(
        verdict=verdict_for(ev, findings),
        loss_shape=ev.loss.mean_shape,
        findings=findings,
        rank_shapes=ev.loss.rank_shapes,
        ranks=rank_summaries(ev),
        divergence_step=div.step if div else None,
        last_agree_step=div.last_agree_step if div else None,
        agreement=[AgreementSpan(**span) for span in ev.agreement.timeline],
        world_size=ev.world_size,
        coverage=coverage(ev),
        grad_norm_kind=("local" if _grad_norm_column(ev) == "grad_norm_local" else "reduced") if ev.has_records else "",
        events=ev.events.all,
        warnings=ev.warnings,
        run=run_facts(ev),
        sources=sorted(
            {str(p) for p in (ev.logs.files if ev.logs is not None else [])}
            | ({str(ev.records.run_dir / "records")} if ev.records is not None else set())
        ),
        loss_series=_series(ev.losses.sort("rank", "step"), "loss"),
        grad_norm_series=_series(ev.steps.sort("rank", "step"), _grad_norm_column(ev)) if ev.has_records else {},
    )
    _with_baseline(ev, diag)
    return diag


def diagnose(paths: Sequence[str | Path], baseline: Sequence[str | Path] | None = None) -> Diagnosis:
    """Diagnose ``paths``; with ``baseline`` (a single-card or earlier healthy run),
    compare the loss curves too (doctor/baseline.py)."""
    ev = load_evidence(paths)
    if baseline:
        load_baseline(ev, baseline)
    return diagnose_evidence(ev)
