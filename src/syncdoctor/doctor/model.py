"""What a diagnosis is: the data every analysis fills in and every renderer
(terminal, JSON, HTML) reads. Plain dataclasses and the wording of their verdicts;
no behaviour beyond the JSON form, and no import of any other part of the doctor
(Jupyter's display hook is added by report/jupyter.py)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields, is_dataclass
from typing import Any, Literal

from syncdoctor.rulebook import Severity

Verdict = Literal["healthy", "sync_problem", "not_sync_problem", "inconclusive"]
DIAGNOSIS_SCHEMA = "syncdoctor.diagnosis/1"
# How every renderer words each verdict.
VERDICT_TEXT = {
    "healthy": "Healthy: no sign of a sync problem",
    "sync_problem": "Sync problem: the ranks are not training the same model",
    "not_sync_problem": "Not a sync problem: the cause lies elsewhere",
    "inconclusive": "Inconclusive: not enough evidence either way",
}
# The verdicts of a comparison with a baseline run (doctor/baseline.py), and their wording.
BaselineVerdict = Literal["agree", "parallel_part", "not_parallel_part", "better", "inconclusive"]
BASELINE_VERDICT_TEXT = {
    "agree": "the curves agree (within the baseline's noise)",
    "parallel_part": "the parallel part: this run is worse where the baseline is fine",
    "not_parallel_part": "not the parallel part: the baseline shows the same problem",
    "better": "better than the baseline",
    "inconclusive": "cannot tell: too little overlap between the two curves",
}

# Stable JSON values of Finding.category.
CATEGORIES = (
    "healthy",
    "train.divergence",
    "hparam.lr_scaling",
    "config.rank_identity",
    "config.launch",
    "env.device",
    "data.seed",
    "data.sharding",
    "sync.incomplete_reduce",
    "sync.step_misalignment",
    "sync.reduce_op",
    "sync.control_flow",
    "model.init_mismatch",
    "model.mode_mismatch",
    "model.buffer_divergence",
    "optim.state_mismatch",
    "loss.definition_mismatch",
    "code.version_mismatch",
    "numeric.overflow",
    "comm.fault",
    "process.crash",
    "hardware.corruption",
)


@dataclass
class LossShape:
    """The shape of one loss series and the numbers that decided it."""

    shape: str  # noise | decreasing | diverging | sawtooth | spike | nonfinite | plateau_chance | flat | too_short
    rank: int | None  # None: the all-rank mean curve
    n_points: int
    amplitude: float | None = None  # typical step-to-step jump relative to the level
    rhythm: float | None = None  # fraction of steps where the direction flips
    trend: float | None = None  # relative change first→last quarter
    detail: str = ""  # one human line: why this shape


@dataclass
class Event:
    """A communication or process event found in a log or a record."""

    kind: str  # timeout | retry | watchdog | network | crash | oom | mismatch | configuration | exit | info
    raw: str  # the line as found (never executed, always escaped when rendered)
    source: str  # file path
    line: int | None = None
    rank: int | None = None
    host: str | None = None
    t: float | None = None  # unix time when the line carried one
    step: int | None = None  # aligned training step, when known
    benign: bool = False  # known-normal noise (e.g. msrun start-up topology retries)


@dataclass
class Finding:
    code: str
    category: str
    severity: Severity
    confidence: float  # 0..1
    title: str
    ranks: list[int] = field(default_factory=list)
    step: int | None = None
    tensor: str | None = None
    evidence: list[str] = field(default_factory=list)
    fix: str = ""
    # The cause itself was observed (a setting seen different at start), not inferred
    # from its consequence: it ranks first among findings as likely.
    direct: bool = False
    # The stage of the data-parallel contract the rule tests (records/stages.py): where
    # in the step's dataflow the cause sits.
    stage: str | None = None
    # [right, fired]: in how many labelled runs where the rule fired its cause was the
    # right one (doctor/calibration.py); the confidence is measured from it. None: the
    # rule has no measurement, and the confidence is its own estimate.
    measured: list[int] | None = None


def confidence_text(f: Finding, percent: str) -> str:
    """How every renderer words a confidence (``percent``: the number, formatted)."""
    if f.measured is None:
        return f"{percent} % (the rule's estimate: not measured)"
    right, fired = f.measured
    return f"{percent} % (measured: its cause was right in {right} of {fired} labelled runs where it fired)"


@dataclass
class RankSummary:
    rank: int
    steps: int | None = None
    last_loss: float | None = None
    mean_loss: float | None = None
    grad_norm: float | None = None
    status: str = ""  # ok | crashed | missing | stalled | ...
    note: str = ""


@dataclass
class AgreementSpan:
    """Consecutive cross-rank checks of the parameters with the same outcome: which
    ranks held the majority's parameters and which had parted from them."""

    first_step: int
    last_step: int
    checks: int  # check steps in the span
    ranks: int  # ranks that reported at these checks
    parted: list[int] = field(default_factory=list)  # outside the majority; empty: all agreed
    missing: list[int] = field(default_factory=list)  # expected ranks that did not report
    what: list[str] = field(default_factory=list)  # what the live check saw differ (param, grad, ...)
    tensor: str | None = None  # first differing tensor, from the live check
    no_majority: bool = False  # no strict majority held one value: every rank of the split is listed


@dataclass
class RankParting:
    rank: int
    parted_at_step: int | None
    direction: str | None  # "worse" (higher loss) | "better"
    shape: str


@dataclass
class BaselineComparison:
    """The comparison's outcome: what `diagnose --baseline` adds to a diagnosis."""

    path: str
    verdict: BaselineVerdict
    summary: str
    aligned_by: str  # "step" | "samples"
    run_world_size: int | None
    baseline_world_size: int | None
    run_global_batch: int | None
    baseline_global_batch: int | None
    run_shape: LossShape | None
    baseline_shape: LossShape | None
    run_problem: str | None  # blow-up | stuck | jumps | None (PROBLEM)
    baseline_problem: str | None
    parted_at_step: int | None = None  # in the run's steps
    parted_at_baseline_step: int | None = None  # the same point in the baseline's steps
    direction: str | None = None  # worse | better: the run against the baseline after the parting
    run_loss_at_parting: float | None = None  # both smoothed (rolling median), at the parting
    baseline_loss_at_parting: float | None = None
    run_loss_at_end: float | None = None  # both smoothed, at the last compared point
    baseline_loss_at_end: float | None = None
    compared_steps: list[int] = field(default_factory=list)  # [first, last] run steps compared
    compared_points: int = 0
    scale: str = "log"  # log | linear: where the difference is measured
    noise_band: float | None = None  # half-width of the band, in that scale
    baseline_noise: float | None = None  # σ of one baseline point, in that scale
    early_gap: float | None = None  # the gap over the first compared points, in that scale
    window: int | None = None  # points per rolling median
    ranks: list[RankParting] = field(default_factory=list)
    evidence: list[str] = field(default_factory=list)
    # For the plot: {"run": [[run step, loss]], "baseline": [[run step, loss]]}; the
    # baseline placed on the run's step axis by the alignment.
    series: dict[str, list[list[float]]] = field(default_factory=dict)

    def to_json(self, include_series: bool = False) -> dict[str, Any]:
        data = asdict(self)
        data["verdict_text"] = BASELINE_VERDICT_TEXT[self.verdict]
        if not include_series:
            data.pop("series")
        return data


@dataclass
class Diagnosis:
    verdict: Verdict
    loss_shape: LossShape | None
    findings: list[Finding] = field(default_factory=list)  # most likely root cause first
    rank_shapes: list[LossShape] = field(default_factory=list)
    ranks: list[RankSummary] = field(default_factory=list)
    divergence_step: int | None = None
    events: list[Event] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)  # input problems, partial data
    sources: list[str] = field(default_factory=list)
    # Series for plots, at most SERIES_POINTS per rank: {rank: [[step, value], ...]}
    loss_series: dict[int, list[list[float]]] = field(default_factory=dict)
    grad_norm_series: dict[int, list[list[float]]] = field(default_factory=dict)
    # The divergence bracket: the last check at which every rank agreed before
    # divergence_step (None: none did, or no check came before it).
    last_agree_step: int | None = None
    agreement: list[AgreementSpan] = field(default_factory=list)  # the replica-agreement timeline
    world_size: int | None = None
    grad_norm_kind: str = ""  # "local": each rank's own gradient before the reduction; "reduced": after it
    run: dict[str, str] = field(default_factory=dict)  # what ran, from the snapshots (doctor/run_facts.py)
    # `diagnose --baseline`: the comparison with a baseline run (doctor/baseline.py), else None.
    baseline: BaselineComparison | None = None
    # What the diagnosis covered and what it could not see (doctor/coverage.py).
    coverage: list[str] = field(default_factory=list)

    def to_json(self, include_series: bool = False) -> dict[str, Any]:
        """The JSON form; plot series only on request (they dominate its size)."""
        series = ("loss_series", "grad_norm_series")
        out: dict[str, Any] = {"schema": DIAGNOSIS_SCHEMA}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in series:
                if include_series:
                    out[f.name] = {str(k): v for k, v in value.items()}
            elif f.name == "baseline":
                if value is not None:
                    out[f.name] = value.to_json(include_series)
            elif isinstance(value, list):
                out[f.name] = [asdict(v) if is_dataclass(v) and not isinstance(v, type) else v for v in value]
            else:
                out[f.name] = asdict(value) if is_dataclass(value) and not isinstance(value, type) else value
        return out

    @property
    def exit_code(self) -> int:
        return 1 if any(f.severity == "error" for f in self.findings) else 0
