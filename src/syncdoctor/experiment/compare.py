"""The anomaly measures of one run folder, read through the doctor, and what the
variants change against the control.

An anomaly is one of:
- `replica_mismatch`: the replicas stopped being bitwise identical (the probe's checks;
  the doctor's divergence), with the first step;
- `loss_offset`: ranks sit at steady loss offsets from the same-step mean (the test of
  rule SD701, on the doctor's per-rank offsets);
- `shape`: the all-rank loss curve is a sawtooth or has spikes (doctor/shape.py);
- `blowup`: the loss diverges or turns non-finite (mean curve or any rank);
- `cause:SDnnn`: the doctor's top root cause, when its verdict is not "healthy".

An anomaly is gone in a variant when the control has it and the variant, run and
applied, does not.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from syncdoctor.doctor.rules._thresholds import OFFSET_MIN, OFFSET_SAME_SIDE, OFFSET_T

SHAPE_ANOMALIES = ("sawtooth", "spike")
# What the replicas hold that data parallelism keeps identical (the doctor's divergence
# also names differing settings and data, which are causes, not the replicas parting).
REPLICA_STATE = ("param", "opt", "grad", "buffer", "mode", "counter")
# Findings that say the loss blew up (whatever the curve's shape was called).
BLOWUP_CATEGORIES = ("train.divergence", "numeric.overflow")
BLOWUP_SHAPES = ("diverging", "nonfinite")
ANOMALY_TEXT = {
    "replica_mismatch": "the replica mismatch",
    "loss_offset": "the per-rank loss offsets",
    "shape": "the {shape} loss curve",
    "blowup": "the loss blow-up",
}
# What a variant's removing an anomaly says about its cause.
MEANING = {
    "single": "it needs several ranks: something differs between the ranks, not the model or the recipe",
    "seeds": "the ranks draw different random numbers (initialisation, dropout or data order)",
    "broadcast": "the replicas start different (initial parameters or buffers)",
    "hparams": "an optimizer or loss hyperparameter (or the optimizer state) differs between ranks",
    "data": "the ranks do not read disjoint shards of one global order (overlap, unseeded shuffle)",
    "modes": "the ranks run in different train/eval modes",
}


@dataclass
class Measures:
    name: str  # control or the variant
    folder: str
    ran: bool = True  # False: not applied by the orchestrator (single on an unknown launcher)
    returncode: int | None = None
    timed_out: bool = False
    applied: bool | None = None  # from the ranks' variant events; None: not reported
    how: str = ""  # what the variant changed, or why it was not applied
    world_size: int | None = None
    first_lr: float | None = None  # the learning rate of the first recorded step (rank 0's)
    steps: int | None = None
    replicas_agree: bool | None = None  # None: no check to tell
    first_mismatch_step: int | None = None
    mismatch_what: list[str] = field(default_factory=list)
    offsets: dict[int, float] = field(default_factory=dict)  # steady offsets only
    shape: str | None = None
    blowup: bool = False
    verdict: str | None = None
    top_code: str | None = None
    top_title: str | None = None
    top_category: str | None = None
    error: str = ""  # the folder could not be diagnosed
    loss_curve: list[list[float]] = field(default_factory=list)  # [step, mean loss over ranks]

    @property
    def anomalies(self) -> dict[str, str]:
        """anomaly key -> one phrase."""
        found: dict[str, str] = {}
        if self.replicas_agree is False:
            found["replica_mismatch"] = ANOMALY_TEXT["replica_mismatch"]
        if self.offsets:
            found["loss_offset"] = ANOMALY_TEXT["loss_offset"]
        if self.shape in SHAPE_ANOMALIES:
            found["shape"] = ANOMALY_TEXT["shape"].format(shape=self.shape)
        if self.blowup:
            found["blowup"] = ANOMALY_TEXT["blowup"]
        if self.verdict not in (None, "healthy") and self.top_code:
            found[f"cause:{self.top_code}"] = f"the doctor's top cause ({self.top_code}: {self.top_title})"
        return found

    @property
    def usable(self) -> bool:
        """A run whose records can be compared: it ran, was applied and was diagnosed."""
        return self.ran and not self.error and self.applied is not False and self.steps is not None

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out.pop("loss_curve")
        out["offsets"] = {str(k): v for k, v in self.offsets.items()}
        out["anomalies"] = sorted(self.anomalies)
        return out


def measure(name: str, folder: Path) -> Measures:
    """The measures of one run folder (the doctor's evidence; no rule is re-implemented)."""
    from syncdoctor.doctor.diagnose import diagnose_evidence, load_evidence
    from syncdoctor.doctor.evidence import int_of
    from syncdoctor.errors import InputError

    m = Measures(name, str(folder))
    try:
        ev = load_evidence([folder])
        diag = diagnose_evidence(ev)
    except (InputError, OSError, ValueError) as exc:
        m.error = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        return m
    m.world_size = diag.world_size
    if ev.has_records:
        m.steps = int_of(ev.steps["step"].max())
        first = ev.steps.filter(ev.steps["lr"].is_not_null()).sort("step", "rank").head(1)
        m.first_lr = float(first["lr"][0]) if first.height else None
    elif ev.losses.height:
        m.steps = int_of(ev.losses["step"].max())
    # The agreement timeline (the checks of the parameters) first; the step records'
    # divergence where there is no check. A differing setting or differing data is a
    # cause the doctor names; it is not the replicas parting.
    parted = [span for span in ev.agreement.timeline if span.get("parted")]
    div = ev.replicas.divergence
    if parted:
        m.replicas_agree, m.first_mismatch_step = False, int(parted[0]["first_step"])
        m.mismatch_what = list(parted[0].get("what") or ["param"])
    elif div is not None and set(div.what) & set(REPLICA_STATE):
        m.replicas_agree, m.first_mismatch_step, m.mismatch_what = False, div.step, list(div.what)
    elif ev.agreement.timeline or (ev.has_records and len(ev.ranks) > 1):
        m.replicas_agree = True
    offsets = ev.loss.offsets
    if offsets is not None:
        odd = {
            r: offsets.by_rank[r]
            for r, t in offsets.t_stat.items()
            if abs(t) > OFFSET_T and abs(offsets.by_rank[r]) > OFFSET_MIN and offsets.same_sign[r] >= OFFSET_SAME_SIDE
        }
        if odd and not (len(odd) == len(offsets.by_rank) and len(odd) > 2):
            m.offsets = {r: round(v, 4) for r, v in sorted(odd.items())}
    shape = diag.loss_shape
    m.shape = shape.shape if shape is not None else None
    m.blowup = (
        m.shape in BLOWUP_SHAPES
        or any(s.shape == "nonfinite" for s in diag.rank_shapes)
        or any(f.category in BLOWUP_CATEGORIES for f in diag.findings)
    )
    m.verdict = diag.verdict
    if diag.findings:
        top = diag.findings[0]
        m.top_code, m.top_title, m.top_category = top.code, top.title, top.category
    if ev.records is not None:
        events = [e for e in ev.records.events if e.get("event") == "variant" and isinstance(e.get("variant"), dict)]
        if events:
            applied = [bool(e["variant"].get("applied")) for e in events]
            m.applied = all(applied)
            texts = sorted({str(e["variant"].get("what") or e["variant"].get("why") or "") for e in events} - {""})
            m.how = "; ".join(texts)[:300]
    if ev.losses.height:
        import polars as pl

        mean = ev.losses.group_by("step").agg(pl.col("loss").mean()).sort("step")
        m.loss_curve = [[float(s), float(v)] for s, v in zip(mean["step"], mean["loss"], strict=True)]
    return m


@dataclass
class Comparison:
    control: Measures
    variants: list[Measures]
    removed: dict[str, list[str]]  # variant -> anomaly keys it removed
    added: dict[str, list[str]]  # variant -> anomaly keys it brought that the control lacks
    verdict: list[str]

    def to_json(self) -> dict[str, Any]:
        return {
            "control": self.control.to_json(),
            "variants": [v.to_json() for v in self.variants],
            "removed": self.removed,
            "added": self.added,
            "verdict": self.verdict,
        }


def single_rank_view(m: Measures) -> dict[str, str]:
    """The anomalies one rank can show at all: no replicas to compare, no offsets between
    ranks, and the rules that compare ranks cannot fire; what is left is the curve's own
    shape, its blow-up, and a top cause that is not about the ranks working together."""
    from syncdoctor.doctor.diagnose import NOT_SYNC

    keep = {"shape", "blowup"}
    if m.top_category in NOT_SYNC:
        keep.add(f"cause:{m.top_code}")
    return {k: t for k, t in m.anomalies.items() if k in keep}


def compare(control: Measures, variants: list[Measures]) -> Comparison:
    base = control.anomalies
    removed: dict[str, list[str]] = {}
    added: dict[str, list[str]] = {}
    for v in variants:
        if not v.usable or (v.name != "single" and v.applied is not True):
            continue  # a variant the ranks did not report applying is the control again
        now = v.anomalies
        if v.name == "single":
            now = single_rank_view(v)
            gone = [k for k in base if k not in now]
            new = [k for k in now if k not in base]
        else:
            gone = [k for k in base if k not in now]
            new = [k for k in now if k not in base and not k.startswith("cause:")]
        removed[v.name] = gone
        if new:
            added[v.name] = new
    return Comparison(control, variants, removed, added, _verdict(control, variants, removed, added))


def _verdict(
    control: Measures, variants: list[Measures], removed: dict[str, list[str]], added: dict[str, list[str]]
) -> list[str]:
    lines: list[str] = []
    base = control.anomalies
    if not control.usable:
        why = control.error or ("timed out" if control.timed_out else "it recorded no step")
        return [f"the control run cannot be compared: {why}"]
    if not base:
        changed = sorted(added)
        if changed:
            lines.append(
                "no anomaly in the control run: nothing to explain; but "
                + "; ".join(f"{v} shows {', '.join(added[v])}" for v in changed)
            )
        else:
            lines.append("no anomaly in the control run: nothing to explain; no variant changed anything")
    else:
        texts = {v.name: v.anomalies for v in variants}
        single = next((v for v in variants if v.name == "single" and v.usable), None)
        shared = [k for k in base if single is not None and k in single_rank_view(single)]
        if shared:
            others = [base[k] for k in shared if k != "blowup"]
            if "blowup" in shared:
                line = "the single-rank baseline shows the same blow-up: not the parallel part"
                lines.append(line + (f" (it also shows {', '.join(others)})" if others else ""))
            else:
                lines.append(f"the single-rank baseline shows {', '.join(others)} too: not the parallel part")
        for key, text in base.items():
            if key in shared:
                continue
            gone_in = [name for name, gone in removed.items() if key in gone and name != "single"]
            # A variant that removes one anomaly but brings another (its forcing itself
            # parts the replicas, say) explains nothing: it is named, not credited.
            by = [name for name in gone_in if name not in added]
            traded = [name for name in gone_in if name in added]
            if traded:
                lines.append(
                    "; ".join(
                        f"{name} removes {text} but shows {', '.join(texts[name][k] for k in added[name])}"
                        for name in traded
                    )
                    + ": that is a different run, not an explanation"
                )
            if by:
                lines.append(f"{', '.join(by)} remove{'s' if len(by) == 1 else ''} {text} → {_meaning(by)}")
            elif single is not None and key in removed.get("single", []) and key in ("shape", "blowup"):
                lines.append(f"the single-rank baseline does not show {text} → {MEANING['single']}")
            else:
                lines.append(f"no variant removes {text}")
    for v in variants:
        if not v.ran:
            lines.append(f"{v.name}: not applied: {v.how}")
        elif v.error:
            lines.append(f"{v.name}: no result: {v.error}")
        elif v.applied is False:
            lines.append(f"{v.name}: not applied: {v.how or 'the ranks said so'}")
        elif v.applied is None and v.name != "single":
            lines.append(f"{v.name}: not reported by the ranks (no variant event): its rerun is the control again")
    return lines


def _meaning(names: list[str]) -> str:
    if {"seeds", "broadcast"} <= set(names) and len(names) == 2:
        return "the replicas start different (init)"
    return "; ".join(f"{n}: {MEANING.get(n, '')}" for n in names) if len(names) > 1 else MEANING.get(names[0], "")
