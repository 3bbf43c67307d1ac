from __future__ import annotations

from pathlib import Path

import pytest

from syncdoctor.preflight import run_preflight
from syncdoctor.preflight.rank_table import RankTableError, load_rank_table


def codes(findings) -> list[tuple[str, int]]:
    return [(f.code, f.line) for f in findings]


def test_duplicate_rank_wrong_server_count_repeated_ip_are_exactly_three_errors(fixtures: Path) -> None:
    findings = run_preflight([], fixtures / "rank_tables" / "three_errors.json")
    assert sorted(codes(findings)) == [("PF101", 3), ("PF102", 16), ("PF106", 15)]
    assert {f.severity for f in findings} == {"error"}


@pytest.mark.parametrize("name", ["good_v1.json", "good_v12_superpod.json", "good_group_list.json"])
def test_correct_tables_are_silent(fixtures: Path, name: str) -> None:
    assert run_preflight([fixtures / "rank_tables" / name]) == []


def test_other_table_mistakes(fixtures: Path) -> None:
    findings = run_preflight([fixtures / "rank_tables" / "bad_misc.json"])
    assert codes(findings) == [("PF104", 9), ("PF105", 9), ("PF108", 13), ("PF103", 16), ("PF109", 20)]


def test_malformed_json_names_line_and_column(fixtures: Path) -> None:
    [finding] = run_preflight([], fixtures / "rank_tables" / "malformed.json")
    assert (finding.code, finding.line, finding.col) == ("PF100", 4, 3)
    assert "Expecting ',' delimiter" in finding.message
    with pytest.raises(RankTableError) as info:
        load_rank_table(fixtures / "rank_tables" / "malformed.json")
    assert info.value.pos == (4, 3)


def test_json_that_is_not_a_rank_table_is_ignored_when_walking(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text('{"lr": 0.1}')
    assert run_preflight([tmp_path]) == []


def test_rank_size_against_table(fixtures: Path) -> None:
    table = fixtures / "rank_tables" / "good_v1.json"
    assert run_preflight([], table, environ={"RANK_SIZE": "4"}) == []
    [finding] = run_preflight([], table, environ={"RANK_SIZE": "8"})
    assert finding.code == "PF107" and "RANK_SIZE=8" in finding.message


def test_missing_rank_table_is_an_input_error(tmp_path: Path) -> None:
    from syncdoctor.preflight.engine import PreflightInputError

    with pytest.raises(PreflightInputError):
        run_preflight([], tmp_path / "nope.json")
