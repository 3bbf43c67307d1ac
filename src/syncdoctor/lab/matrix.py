"""The detection matrix: every fault through the lab, the probe and the doctor.

It is the detector's benchmark: for each fault (and variant) one run, the
doctor's top finding, and whether it names the fault's category; the clean
baseline runs over several seeds and must come out healthy.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from syncdoctor.lab.faults import FAULTS
from syncdoctor.lab.runner import run_lab

CLEAN_SEEDS = (0, 1, 2)


@dataclass
class MatrixRow:
    fault: str
    variant: str
    seed: int
    expected: str
    verdict: str
    top_category: str
    top_code: str
    correct: bool
    onset_step: int | None
    detection_step: int | None
    run_ok: bool
    duration_s: float
    out: str

    def to_json(self) -> dict:
        return asdict(self)


def cases(framework: str = "torch", style: str | None = None) -> list[tuple[str, str, int]]:
    out = [("clean", "", seed) for seed in CLEAN_SEEDS]
    for name, fault in FAULTS.items():
        if name == "clean" or framework not in fault.frameworks or style in fault.ms_styles_not_on:
            continue
        variants = (
            fault.variants_for(framework) if framework == "mindspore" else fault.matrix_variants or fault.variants
        )
        out.extend((name, variant, 0) for variant in variants)
    return out


def run_case(
    fault: str,
    variant: str,
    seed: int,
    out_root: Path,
    world_size: int,
    framework: str,
    steps: int,
    onset: int,
    pg_timeout_s: float,
    style: str | None = None,
) -> MatrixRow:
    from syncdoctor.doctor.diagnose import diagnose

    name = f"{fault}{'-' + variant if variant else ''}-s{seed}"
    result = run_lab(
        fault,
        variant=variant,
        world_size=world_size,
        seed=seed,
        out=out_root / name,
        framework=framework,
        steps=steps,
        onset=onset,
        pg_timeout_s=pg_timeout_s,
        style=style,
    )
    diag = diagnose([result.out])
    top = diag.findings[0] if diag.findings else None
    expected = FAULTS[fault].category
    top_category = top.category if top else "healthy"
    if expected == "healthy":
        correct = diag.verdict == "healthy" and not any(f.severity == "error" for f in diag.findings)
    else:
        correct = top_category == expected
    acts_at_onset = fault not in (
        "clean",
        "init-mismatch",
        "mode-mismatch",
        "buffer-divergence",
        "unseeded-shuffle",
        "shuffle-after-shard",
        "shard-overlap",
        "uneven-shards",
        "duplicate-rank-id",
        "grad-sum",
        "loss-hparam-mismatch",
        "fp16-overflow",
        "lr-not-scaled",
        "lr-too-high",
    )
    return MatrixRow(
        fault,
        variant,
        seed,
        expected,
        diag.verdict,
        top_category,
        top.code if top else "",
        correct,
        onset if acts_at_onset else None,
        top.step if top else None,
        result.ok,
        round(result.duration_s, 1),
        str(result.out),
    )


def run_matrix(
    out_root: str | Path = "runs/matrix",
    world_size: int = 2,
    framework: str = "torch",
    steps: int = 150,
    onset: int = 40,
    pg_timeout_s: float = 10.0,
    only: list[str] | None = None,
    progress: Callable[[MatrixRow], None] | None = None,
    style: str | None = None,
) -> list[MatrixRow]:
    rows = []
    for fault, variant, seed in cases(framework, style):
        if only and fault not in only:
            continue
        row = run_case(fault, variant, seed, Path(out_root), world_size, framework, steps, onset, pg_timeout_s, style)
        rows.append(row)
        if progress:
            progress(row)
    return rows
