"""Fuzz the HCCL rank-table reader and its checks: `python fuzz/fuzz_rank_table.py -atheris_runs=N`."""

import atheris

with atheris.instrument_imports(include=["syncdoctor"]):
    import targets
from _harness import main


def test_one_input(data: bytes) -> None:
    targets.check_rank_table(data)


if __name__ == "__main__":
    main("rank_table", test_one_input)
