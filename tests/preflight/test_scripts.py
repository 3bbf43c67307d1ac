"""Every script check fires on its bad fixture at the marked lines (`# expect: CODE`)
and nothing fires on the corrected twin."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from syncdoctor.preflight import run_preflight
from syncdoctor.preflight.registry import all_checks

SCRIPTS = Path(__file__).resolve().parents[1] / "fixtures" / "preflight" / "scripts"
BAD = sorted(SCRIPTS.glob("*_bad.py"))
_EXPECT = re.compile(r"#\s*expect:\s*(PF\d{3})")


def expected(path: Path) -> set[tuple[int, str]]:
    return {
        (n, m.group(1))
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if (m := _EXPECT.search(line))
    }


@pytest.mark.parametrize("bad", BAD, ids=lambda p: p.stem)
def test_bad_fixture_fires_exactly_at_marked_lines(bad: Path) -> None:
    found = {(f.line, f.code) for f in run_preflight([bad])}
    assert found == expected(bad)
    assert found, "a bad fixture must expect at least one finding"


@pytest.mark.parametrize("bad", BAD, ids=lambda p: p.stem)
def test_corrected_twin_is_silent(bad: Path) -> None:
    good = bad.with_name(bad.name.replace("_bad", "_good"))
    assert good.exists()
    assert [f.render() for f in run_preflight([good])] == []


def test_every_script_check_has_a_bad_fixture() -> None:
    covered = {code for bad in BAD for _, code in expected(bad)}
    script_codes = {c.code for c in all_checks() if c.target == "script"} - {"PF300"}
    assert script_codes <= covered


def test_noqa_suppresses_only_the_named_code(tmp_path: Path) -> None:
    src = (SCRIPTS / "pf313_bad.py").read_text()
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
    bad = (SCRIPTS / "pf303_bad.py").read_text()
    (tmp_path / "train.py").write_text(bad)
    (tmp_path / "utils.py").write_text("import random\n\ndef setup():\n    random.seed(0)\n")
    assert run_preflight([tmp_path]) == []


def test_lab_clean_training_code_has_no_findings() -> None:
    lab = Path(__file__).resolve().parents[2] / "src" / "syncdoctor" / "lab" / "train_torch.py"
    if not lab.exists():
        pytest.skip("lab training script not written yet")
    assert [f.render() for f in run_preflight([lab])] == []
