"""Fuzz the whole diagnosis (records + logs -> findings -> JSON and terminal reports):
`python fuzz/fuzz_diagnose.py -atheris_runs=N`. Files that start with "{" go to
records/rank{i}.jsonl, the others become per-rank logs."""

import atheris

with atheris.instrument_imports(include=["syncdoctor"]):
    import targets
from _harness import main
from corpus import log_files, record_files, split


def test_one_input(data: bytes) -> None:
    chunks = split(data)
    records = record_files([c for c in chunks if c.startswith(b"{")])
    logs = log_files([c for c in chunks if not c.startswith(b"{")])
    targets.check_diagnose(records, logs)


if __name__ == "__main__":
    main("diagnose", test_one_input)
