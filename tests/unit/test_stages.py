"""The data-parallel contract as data (records/stages.py): every rule names the stage
it tests, every part the MindSpore probe observes belongs to one stage, and of two
findings alike in severity, likelihood and directness the earlier stage ranks first."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from syncdoctor.doctor.coverage import STAGE_NAMES
from syncdoctor.doctor.diagnose import ranked
from syncdoctor.doctor.model import Finding
from syncdoctor.doctor.rules import all_rules
from syncdoctor.records import contract, stages


def test_stage_keys_are_unique_and_outside_names_no_stage():
    keys = [s.key for s in stages.STAGES]
    assert len(set(keys)) == len(keys)
    assert not set(keys) & set(stages.OUTSIDE)
    assert all(s.name and s.holds and s.fields for s in stages.STAGES)


def test_every_field_a_stage_names_is_a_field_of_the_record_contract():
    kinds = {"snapshot": contract.SNAPSHOT, "step": contract.STEP, "end": contract.END}
    known = {f"{kind}.{f.name}" for kind, fields in kinds.items() for f in fields}
    assert [f for s in stages.STAGES for f in s.fields if f not in known] == []


def test_docs_list_every_stage_with_its_rules():
    """docs/records.md's table: a row per stage, in the dataflow order, naming the rules
    that test it."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "records.md").read_text()
    table = text[text.index("## The contract, stage by stage") :]
    table = table[: table.index("\n## ", 1)]  # this section alone: later ones hold tables too
    rows = [line for line in table.splitlines() if line[:2] == "| " and line[2:3].isdigit()]
    assert [row.split("(`")[1].split("`)")[0] for row in rows] == [s.key for s in stages.STAGES]
    for row, stage in zip(rows, stages.STAGES, strict=True):
        codes = sorted(rule.code for rule in all_rules() if rule.stage == stage.key)
        assert row.rstrip(" |").endswith(", ".join(codes) or "—"), (stage.key, codes)
        assert all(f"`{field}`" in row for field in stage.fields), stage.key


def test_every_rule_names_a_known_stage():
    unknown = {rule.code: getattr(rule, "stage", None) for rule in all_rules()}
    unknown = {code: stage for code, stage in unknown.items() if not (stage and stages.is_known(stage))}
    assert unknown == {}


def test_every_part_the_mindspore_probe_observes_belongs_to_exactly_one_stage():
    parts = Counter(part for s in stages.STAGES for part in s.parts)
    assert set(parts) == set(STAGE_NAMES), "coverage.STAGE_NAMES and the contract's parts must name the same parts"
    assert [p for p, n in parts.items() if n > 1] == []
    assert stages.stage_of_part("grads_reduced") == "reduced"
    assert stages.stage_of_part("no such part") is None


def test_the_dataflow_order():
    order = [s.key for s in stages.STAGES]
    assert (
        order.index("data")
        < order.index("forward")
        < order.index("backward")
        < order.index("reduced")
        < order.index("grads_at_update")
    )
    assert order.index("grads_at_update") < order.index("optimizer") < order.index("params")
    assert stages.order("comm") == stages.order(None) == len(stages.STAGES)


def _finding(code: str, stage: str, confidence: float = 0.8, direct: bool = False, step: int | None = None) -> Finding:
    return Finding(code, "x.y", "error", confidence, code, step=step, stage=stage, direct=direct)


def test_of_equally_likely_causes_the_earlier_stage_ranks_first():
    late, early = _finding("SD100", "params"), _finding("SD999", "data")
    assert [f.code for f in ranked([late, early])] == ["SD999", "SD100"]
    # likelihood and directness still come first
    likelier = _finding("SD100", "params", confidence=0.9)
    assert [f.code for f in ranked([early, likelier])] == ["SD100", "SD999"]
    observed = _finding("SD100", "params", direct=True)
    assert [f.code for f in ranked([early, observed])] == ["SD100", "SD999"]


RULES = Path(__file__).resolve().parents[1] / "rules"


def test_the_cause_says_which_earlier_stages_held_and_which_parted_too():
    """doctor/upstream.py on a real lab run (SD601's fire case: one rank's optimizer
    configuration changes at step 20): a cause named at the optimizer sees every earlier
    stage it observed hold at the check of step 20; a cause named after it (the
    parameters) sees the optimizer apart there too."""
    from syncdoctor.doctor.diagnose import load_evidence
    from syncdoctor.doctor.upstream import upstream_line

    ev = load_evidence([RULES / "SD601" / "fire"])
    at_optimizer = upstream_line(ev, _finding("SD601", "optimizer", step=20))
    assert at_optimizer is not None and "check of step 20" in at_optimizer
    assert "held on every rank: data (data_fp)" in at_optimizer and "apart" not in at_optimizer
    at_params = upstream_line(ev, _finding("SD971", "params", step=20))
    assert at_params is not None and "also apart at that step: optimizer (config_fp)" in at_params
    assert upstream_line(ev, _finding("SD951", "comm", step=20)) is None  # outside the dataflow
    assert upstream_line(ev, _finding("SD601", "optimizer")) is None  # no step: nothing to compare at


def test_what_the_upstream_line_compares_is_what_each_stage_names():
    """doctor/upstream.py's columns per stage are fields that stage lists (step records)."""
    from syncdoctor.doctor.upstream import COMPARED

    fields = {s.key: set(s.fields) for s in stages.STAGES}
    assert set(COMPARED) <= set(fields)
    stray = [(k, c) for k, cols in COMPARED.items() for c, _ in cols if f"step.{c}" not in fields[k]]
    assert stray == []
    assert {keeps for cols in COMPARED.values() for _, keeps in cols} == {"equal", "differ"}
