"""Shared fixtures. Lab runs are real multi-process jobs (seconds each), so every
test module asks for them through one session-wide cache: each configuration
runs once per test session."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from syncdoctor.lab.runner import LabResult, run_lab

# Short timeouts keep the faults that end in a collective timeout fast.
LAB_PG_TIMEOUT_S = 10.0


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A test that asks for a lab run spawns real multi-process training: it is slow,
    whatever module it is in (modules that mix fast and lab tests need no marks)."""
    for item in items:
        if "lab" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.slow)


def pids_running_with(text: str) -> list[int]:
    """Live processes whose command line mentions `text` (read from /proc, by pid)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (entry / "stat").read_text().split(")")[-1].split()[0]
        except OSError:
            continue
        if text in cmdline and state != "Z":
            found.append(int(entry.name))
    return found


@pytest.fixture(scope="session")
def lab(tmp_path_factory: pytest.TempPathFactory):
    cache: dict[tuple, LabResult] = {}
    root = tmp_path_factory.mktemp("lab")

    def run(fault: str, variant: str = "", world_size: int = 2, seed: int = 0, **kwargs) -> LabResult:
        key = (fault, variant, world_size, seed, tuple(sorted(kwargs.items())))
        if key not in cache:
            name = "-".join(str(p) for p in (fault, variant or "default", f"w{world_size}", f"s{seed}", len(cache)))
            kwargs.setdefault("pg_timeout_s", LAB_PG_TIMEOUT_S)
            cache[key] = run_lab(fault, variant=variant, world_size=world_size, seed=seed, out=root / name, **kwargs)
        return cache[key]

    return run
