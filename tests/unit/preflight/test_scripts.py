"""Script checks beyond their fixture cases (tests/rules/PF3xx): noqa, project-wide
facts, files outside torch and MindSpore, the lab's own training code."""

from __future__ import annotations

from pathlib import Path

import pytest

from syncdoctor.preflight import run_preflight

RULES = Path(__file__).resolve().parents[2] / "rules"


def test_noqa_suppresses_only_the_named_code(tmp_path: Path) -> None:
    src = (RULES / "PF313" / "fire.py").read_text()
    src = src.replace("optimizer.step()  # expect: PF313", "optimizer.step()  # noqa: PF313")
    src = src.replace("dist.all_reduce(loss)  # expect: PF313", "dist.all_reduce(loss)  # noqa: E501")
    path = tmp_path / "train.py"
    path.write_text(src)
    assert sorted(f.line for f in run_preflight([path])) == [18, 21]


def test_unparsable_script_is_reported(tmp_path: Path) -> None:
    (tmp_path / "old.py").write_text("print 'hello'\n")
    [finding] = run_preflight([tmp_path])
    assert (finding.code, finding.line, finding.severity) == ("PF300", 1, "warning")


def test_no_findings_outside_torch_and_mindspore(tmp_path: Path) -> None:
    (tmp_path / "util.py").write_text(
        "import random\nfrom torch import distributed as dist\n"
        "def f(rank):\n    if rank == 0:\n        print(random.random())\n"
    )
    assert run_preflight([tmp_path]) == []


def test_seed_set_in_another_file_counts(tmp_path: Path) -> None:
    bad = (RULES / "PF303" / "fire.py").read_text()
    (tmp_path / "train.py").write_text(bad)
    (tmp_path / "utils.py").write_text("import random\n\ndef setup():\n    random.seed(0)\n")
    assert run_preflight([tmp_path]) == []


def test_lab_clean_training_code_has_no_findings() -> None:
    lab = Path(__file__).resolve().parents[3] / "src" / "syncdoctor" / "lab" / "train_torch.py"
    if not lab.exists():
        pytest.skip("lab training script not written yet")
    assert [f.render() for f in run_preflight([lab])] == []
