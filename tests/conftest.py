"""Shared fixtures and the tiers. Lab runs are real multi-process jobs (seconds each),
so every test module asks for them through one session-wide cache: each configuration
runs once per test session, and once for all the workers of a parallel run
(pytest-xdist: the first worker to need it runs it, the others wait for it and read it)."""

from __future__ import annotations

import fcntl
import functools
import hashlib
import json
import os
import pickle
from collections import Counter
from collections.abc import Callable, Hashable, Iterator
from pathlib import Path
from types import ModuleType

import hypothesis
import pytest

from syncdoctor.lab.runner import LabResult, run_lab
from tests.ahead import Ahead

# Short timeouts keep the faults that end in a collective timeout fast.
LAB_PG_TIMEOUT_S = 10.0

# The property and fuzz tests draw new inputs on every run, which is how they find new
# bugs on a developer's machine. SYNCDOCTOR_FUZZ_SEED (set by .ci/run) fixes their draws
# (hypothesis derandomized, libFuzzer seeded: tests/unit/reliability/test_atheris.py) so
# that a CI run fails only on what the change broke, not on a first draw of an old bug.
FUZZ_SEED = os.environ.get("SYNCDOCTOR_FUZZ_SEED")
if FUZZ_SEED:
    hypothesis.settings.register_profile("fixed-draws", derandomize=True, database=None)
    hypothesis.settings.load_profile("fixed-draws")


# The tiers are folders: tests/unit and tests/rules are the fast tier (no training,
# seconds in all), tests/e2e is the slow tier (real multi-process training), and
# tests/mindspore runs in its own environment (.venv-ms). The slow mark follows the
# folder, so `-m "not slow"` and `pytest tests/unit tests/rules` select the same tests.
TESTS = Path(__file__).resolve().parent
SLOW_DIRS = (TESTS / "e2e", TESTS / "mindspore")
FAST_DIRS = (TESTS / "unit", TESTS / "rules")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Marks every test under tests/e2e (and tests/mindspore) slow, by its path; a test
    of the fast tier that asks for a lab run (real training) is an error: it belongs
    under tests/e2e."""
    for item in items:
        path = Path(str(item.path)).resolve()
        if any(path.is_relative_to(d) for d in SLOW_DIRS):
            item.add_marker(pytest.mark.slow)
        elif "lab" in getattr(item, "fixturenames", ()) and any(path.is_relative_to(d) for d in FAST_DIRS):
            raise pytest.UsageError(f"{item.nodeid} asks for a lab run (real training): move it under tests/e2e/")


# Fuzz inputs tried, by target (tests/unit/reliability adds to it). The summary is printed
# by the process that reports: under pytest-xdist each worker hands its counts back when
# it ends, and the controller sums them.
FUZZ_COUNTS: Counter[str] = Counter()


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: object, error: object) -> None:
    FUZZ_COUNTS.update(getattr(node, "workeroutput", {}).get("fuzz_counts", {}))


def pytest_sessionfinish(session: pytest.Session) -> None:
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:
        workeroutput["fuzz_counts"] = dict(FUZZ_COUNTS)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not FUZZ_COUNTS:
        return
    terminalreporter.section("fuzz inputs tried")
    for name, n in sorted(FUZZ_COUNTS.items()):
        terminalreporter.write_line(f"{name:<28} {n:>9,}")
    terminalreporter.write_line(f"{'total':<28} {sum(FUZZ_COUNTS.values()):>9,}")
    out = os.environ.get("SYNCDOCTOR_FUZZ_REPORT")
    if out:
        with open(out, "w", encoding="utf-8") as f:
            json.dump(dict(FUZZ_COUNTS), f, indent=1)


def pids_running_with(text: str) -> list[int]:
    """Live processes whose command line mentions `text`, or whose stdout or stderr is a
    file whose path does (read from /proc, by pid). The second finds the lab's ranks
    whichever way they were started: a rank forked by the fork server has the server's
    command line, and its log as its output, as a spawned rank has."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (entry / "stat").read_text().split(")")[-1].split()[0]
            outputs = [_link(entry / "fd" / fd) for fd in ("1", "2")]
        except OSError:
            continue
        if state != "Z" and any(text in seen for seen in (cmdline, *outputs)):
            found.append(int(entry.name))
    return found


def _link(path: Path) -> str:
    try:
        return os.readlink(path)
    except OSError:
        return ""


def _lab_key(fault: str, variant: str = "", world_size: int = 2, seed: int = 0, **kwargs) -> tuple:
    return (fault, variant, world_size, seed, tuple(sorted(kwargs.items())))


def _lab_runner(tmp_path_factory: pytest.TempPathFactory) -> Callable[[tuple], LabResult]:
    """Runs one lab configuration (a `_lab_key`) and gives its LabResult. Under
    pytest-xdist the workers share one folder (the parent of their temporary folders):
    the first worker to ask for a configuration runs it under a file lock, and every
    other worker waits for the lock and reads the result it left, so one run folder is
    diagnosed by every test that needs it, whichever worker runs the test."""
    base = tmp_path_factory.getbasetemp()
    root = base.parent / "lab-shared" if os.environ.get("PYTEST_XDIST_WORKER") else base / "lab"
    root.mkdir(parents=True, exist_ok=True)

    def obtain(key: tuple) -> LabResult:
        fault, variant, world_size, seed, extra = key
        digest = hashlib.sha256(repr(key).encode()).hexdigest()[:10]
        name = "-".join(str(p) for p in (fault, variant or "default", f"w{world_size}", f"s{seed}", digest))
        saved = root / f"{name}.pickle"
        with open(root / f"{name}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
            if saved.exists():
                result: LabResult = pickle.loads(saved.read_bytes())
                return result
            kwargs = {"pg_timeout_s": LAB_PG_TIMEOUT_S, **dict(extra)}
            result = run_lab(fault, variant=variant, world_size=world_size, seed=seed, out=root / name, **kwargs)
            saved.write_bytes(pickle.dumps(result))
            return result

    return obtain


@pytest.fixture(scope="session", autouse=True)
def launches(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Ahead]:
    """One queue for every real launch the session's modules declare, started ahead two
    at a time in test order (tests/ahead.py), so that the start-up of one (rendezvous,
    imports in one rank while the other waits) overlaps the training of the next across
    module boundaries too. A module declares lab runs in `LAB_RUNS` (a list of `lab()`
    keyword arguments, read by the `lab` fixture) and launches of its own in `LAUNCHES`
    (keys handed to its `launch(key, folder)`, read by the `launched` fixture).

    Under pytest-xdist each worker collects every module but runs only some, so only the
    lab runs (shared between workers by a file lock) are started ahead there."""
    ahead: Ahead[object] = Ahead("launch")
    obtain_lab = _lab_runner(tmp_path_factory)
    under_xdist = bool(os.environ.get("PYTEST_XDIST_WORKER"))
    modules = dict.fromkeys(item.module for item in request.session.items if isinstance(item, pytest.Function))
    for module in modules:
        for declared in getattr(module, "LAB_RUNS", ()):
            key = _lab_key(**declared)
            ahead.submit(("lab", key), functools.partial(obtain_lab, key))
        for key in () if under_xdist else getattr(module, "LAUNCHES", ()):
            ahead.submit((module.__name__, key), _module_launch(module, key, tmp_path_factory))
    try:
        yield ahead
    finally:
        ahead.close()


def _module_launch(module: ModuleType, key: Hashable, tmp_path_factory: pytest.TempPathFactory) -> Callable[[], object]:
    return lambda: module.launch(key, tmp_path_factory.mktemp(module.__name__.rsplit(".", 1)[-1]))


@pytest.fixture(scope="session")
def lab(launches: Ahead, tmp_path_factory: pytest.TempPathFactory) -> Callable[..., LabResult]:
    """`lab(fault, ...)` runs that lab configuration once and gives its LabResult; the
    runs declared in a module's `LAB_RUNS` were started ahead (`launches`), a run nobody
    declared runs when a test asks for it."""
    obtain = _lab_runner(tmp_path_factory)  # the same folder as the runs started ahead

    def run(fault: str, variant: str = "", world_size: int = 2, seed: int = 0, **kwargs) -> LabResult:
        key = _lab_key(fault, variant, world_size, seed, **kwargs)
        result: LabResult = launches.get(("lab", key), functools.partial(obtain, key))
        return result

    return run


@pytest.fixture
def launched(
    request: pytest.FixtureRequest, launches: Ahead, tmp_path_factory: pytest.TempPathFactory
) -> Callable[[Hashable], object]:
    """`launched(key)`: the result of the test module's `launch(key, folder)`, run once
    per session (started ahead when the key is in the module's `LAUNCHES`)."""
    module = request.module
    return lambda key: launches.get((module.__name__, key), _module_launch(module, key, tmp_path_factory))
