"""The doctor's reads of record fields that were once written and read by nothing
(tests/unit/test_record_contract.py holds the doctor to reading every field a probe
writes): each one changes a diagnosis or the report, and stays silent when the
field holds nothing unusual. Hand-written record folders, no training."""

from __future__ import annotations

import io
from pathlib import Path

import polars as pl
from rich.console import Console

from syncdoctor.doctor.diagnose import diagnose
from syncdoctor.doctor.evidence import Evidence
from syncdoctor.doctor.report.html import render_html
from syncdoctor.doctor.report.terminal import render_terminal
from syncdoctor.records import read_run
from tests.unit.doctor.test_rules_records import write_run

TENSORS = ["fc1.weight", "fc1.bias", "fc2.weight"]


def _codes(run: Path) -> list[str]:
    return [f.code for f in diagnose([run]).findings]


def test_sharded_optimizer_state_is_not_a_parting(tmp_path: Path) -> None:
    """ZeRO: each rank fingerprints its own part of the optimizer state."""
    own_part = {r: {"opt_fp": 100 + r} for r in range(2)}
    zero = {"optimizer": {"type": "ZeroRedundancyOptimizer", "param_groups": [{"lr": 0.1}], "state_replicated": False}}
    sharded = diagnose([write_run(tmp_path / "zero", [zero, zero], step_fields=own_part)])
    assert sharded.divergence_step is None
    assert not sharded.findings
    replicated = diagnose([write_run(tmp_path / "plain", [{}, {}], step_fields=own_part)])
    assert replicated.divergence_step == 1  # the same fingerprints under plain DDP: the state parted


def test_config_fingerprint_that_differs_parts_the_replicas(tmp_path: Path) -> None:
    run = write_run(tmp_path / "cfg", [{}, {}, {}], step_fields={r: {"config_fp": 7 if r < 2 else 8} for r in range(3)})
    diag = diagnose([run])
    assert diag.divergence_step == 1
    top = diag.findings[0]
    assert top.code == "SD601" and top.ranks == [2]
    assert any("configuration differs" in e for e in top.evidence)
    alike = write_run(tmp_path / "alike", [{}, {}, {}], step_fields={r: {"config_fp": 7} for r in range(3)})
    assert diagnose([alike]).divergence_step is None


def test_per_tensor_records_name_the_parameter_that_parted(tmp_path: Path) -> None:
    parted = {0: {"param_fp": 1, "tensor_fps": [1, 2, 3]}, 1: {"param_fp": 1, "tensor_fps": [1, 2, 3]}}
    parted[2] = {"param_fp": 9, "tensor_fps": [1, 5, 3]}
    snaps = [{"tensors": TENSORS}] * 3
    assert _parting(write_run(tmp_path / "fps", snaps, step_fields=parted)) == (1, [2], "fc1.bias")
    norms = {r: {"param_fp": 1 if r < 2 else 9, "tensor_norms": [0.5, 0.25, 1.0 if r < 2 else 2.0]} for r in range(3)}
    assert _parting(write_run(tmp_path / "norms", snaps, step_fields=norms)) == (1, [2], "fc2.weight")
    same = {r: {"param_fp": 1, "tensor_norms": [0.5, 0.25, 1.0]} for r in range(3)}
    assert _parting(write_run(tmp_path / "same", snaps, step_fields=same)) is None


def _parting(run: Path) -> tuple[int, list[int], str | None] | None:
    """(step, ranks, tensor) of the first parting of the replicas: what every rule names."""
    div = Evidence(records=read_run(run)).replicas.divergence
    return (div.step, div.ranks, div.tensor) if div else None


def test_optimizer_over_other_parameters_is_named(tmp_path: Path) -> None:
    def optimizer(n: int) -> dict[str, object]:
        return {"optimizer": {"type": "SGD", "param_groups": [{"lr": 0.1}], "n_params": n}}

    run = write_run(tmp_path / "frozen", [optimizer(4), optimizer(4), optimizer(2)])
    top = diagnose([run]).findings[0]
    assert top.code == "SD601" and top.ranks == [2]
    assert any("different numbers of parameters" in e for e in top.evidence)
    assert "SD601" not in _codes(write_run(tmp_path / "alike", [optimizer(4)] * 3))


def test_report_prints_what_ran(tmp_path: Path) -> None:
    snaps = [
        {
            "framework": "mindspore",
            "pid": 4240 + r,
            "auto": True,
            "style": "Model.train (sink)",
            "loader": {"type": "BatchDataset", "pipeline": ["BatchDataset", "ShuffleDataset", "NumpySlicesDataset"]},
        }
        for r in range(2)
    ]
    diag = diagnose([write_run(tmp_path / "run", snaps)])
    assert diag.run["framework"] == "mindspore"
    assert diag.to_json()["run"] == diag.run
    console = Console(file=io.StringIO(), record=True, width=200)
    render_terminal(diag, console)
    html, text = render_html(diag), console.export_text()
    for shown in (
        "mindspore",
        "zero-code",
        "Model.train (sink)",
        "BatchDataset &lt;- ShuffleDataset",
        "rank 1: node0 pid 4241",
    ):
        assert shown in html, shown
        assert shown.replace("&lt;", "<") in text, shown
    assert diagnose([write_run(tmp_path / "bare", [{"framework": None}])]).run == {}


def test_nested_step_fields_are_columns_only_where_a_record_has_them(tmp_path: Path) -> None:
    """Absent list/struct fields are left out of the step frame (memory at scale);
    a run that writes one gets its column, nulls included where a step lacks it."""
    snaps = [{"tensors": TENSORS}, {"tensors": TENSORS}]
    plain = read_run(write_run(tmp_path / "plain", snaps)).steps
    assert {"tensor_fps", "canary", "acts", "replica_fps", "ids"}.isdisjoint(plain.columns)
    assert {"loss", "param_fp", "grad_fp"} <= set(plain.columns)
    with_fps = read_run(write_run(tmp_path / "fps", snaps, step_fields={1: {"tensor_fps": [1, 2, 3]}})).steps
    assert "tensor_fps" in with_fps.columns and "canary" not in with_fps.columns
    assert with_fps["tensor_fps"].drop_nulls().to_list()[0] == [1, 2, 3]
    assert with_fps.filter(pl.col("rank") == 0)["tensor_fps"].null_count() == 20  # rank 1 alone writes it
