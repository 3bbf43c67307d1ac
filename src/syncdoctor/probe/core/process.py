"""What a process of a `syncdoctor run` knows about itself, framework-free: its run
folder, the rank a launcher gave it (or that it is a helper a rank started), the tee of
its output into RUN_DIR/logs/rank{R}.log once it is known to be a rank, the marker that
it imported a framework, and the import hook that runs a callback right after a module
finishes importing. The boot (probe/run/boot.py) and both adapters read it.

The tee is a separate small process, not a thread: it keeps draining the pipe after
the rank dies, so the last lines before a crash, an abort or a SIGKILL still reach
the log. The rank's Python streams were set up before this runs, so their
buffering (decided by isatty at start-up) does not change.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import subprocess
import sys
from collections.abc import Callable
from typing import Any

from syncdoctor.probe.core.state import STATE
from syncdoctor.settings import AUTO_ENV, RANK_PID_ENV, RUN_DIR_ENV

TEE_WAIT_S = 2.0  # at exit, how long a rank waits for its tee to drain

# The tee process. -I -S: no site, no user paths, so it starts in ≈15 ms and imports
# nothing of the user's. It ignores the signals that end the rank's process group so it
# can drain what the rank wrote before dying; it ends when every writer has closed.
_TEE_SOURCE = r"""
import os, select, signal, sys
for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGPIPE):
    signal.signal(s, signal.SIG_IGN)
log = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
sources = {int(sys.argv[2]): int(sys.argv[4]), int(sys.argv[3]): int(sys.argv[5])}
while sources:
    ready, _, _ = select.select(list(sources), [], [])
    for fd in ready:
        data = os.read(fd, 65536)
        if not data:
            del sources[fd]
            continue
        for out in (sources[fd], log):
            try:
                os.write(out, data)
            except OSError:
                pass  # a closed terminal must not stop the log, nor the log the terminal
"""


class _Tee:
    """This process's stdout/stderr, duplicated into one log file."""

    def __init__(self) -> None:
        self.original: tuple[int, int] | None = None  # the fds 1 and 2 had before any tee
        self.proc: subprocess.Popen[bytes] | None = None
        self.path: str | None = None

    def start(self, path: str) -> None:
        if self.path == path:
            return
        os.makedirs(os.path.dirname(path), exist_ok=True)
        _flush_std()
        if self.original is None:
            self.original = (os.dup(1), os.dup(2))
        r_out, w_out = os.pipe()
        r_err, w_err = os.pipe()
        orig_out, orig_err = self.original
        try:
            proc = subprocess.Popen(
                [
                    sys.executable,
                    "-I",
                    "-S",
                    "-c",
                    _TEE_SOURCE,
                    path,
                    str(r_out),
                    str(r_err),
                    str(orig_out),
                    str(orig_err),
                ],
                pass_fds=(r_out, r_err, orig_out, orig_err),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                close_fds=True,
            )
        except OSError:
            for fd in (r_out, w_out, r_err, w_err):
                os.close(fd)
            return
        os.close(r_out)
        os.close(r_err)
        os.dup2(w_out, 1)
        os.dup2(w_err, 2)
        os.close(w_out)
        os.close(w_err)
        self.proc, self.path = proc, path

    def stop(self) -> None:
        """Give fds 1 and 2 back and let the tee drain (bounded): the log is complete
        when the launcher sees this rank exit."""
        if self.original is None or self.proc is None:
            return
        _flush_std()
        os.dup2(self.original[0], 1)
        os.dup2(self.original[1], 2)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=TEE_WAIT_S)  # a forked child that kept the pipe: don't wait on it
        self.proc = None


def _flush_std() -> None:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()


_tee = _Tee()


def stop_tee() -> None:
    """At exit: close this rank's end of the tee and let it drain (bounded)."""
    _tee.stop()


def run_dir() -> str | None:
    return os.environ.get(RUN_DIR_ENV)


def become_rank(rank: int) -> None:
    """Called when this process is known to be rank `rank` (at start-up from the
    launcher's RANK, or at init_process_group): tee its output to its rank log."""
    folder = run_dir()
    if not folder or os.environ.get(AUTO_ENV) != "1" or STATE.rank == rank:
        return
    STATE.rank = rank
    os.environ[RANK_PID_ENV] = str(os.getpid())  # children of a rank are helpers, not ranks
    try:
        _tee.start(os.path.join(folder, "logs", f"rank{rank}.log"))
    except OSError:
        pass


def is_helper() -> bool:
    """A process started by a rank (a data-loader worker, a compile helper): it
    inherited RANK but it is not one."""
    pid = os.environ.get(RANK_PID_ENV)
    return bool(pid) and pid != str(os.getpid())


# (rank variable, size variable) as launchers export them: torchrun and shell loops,
# Open MPI, PMI (mpich, slurm's srun), MindSpore's msrun.
_LAUNCHER_VARS = (
    ("RANK", "WORLD_SIZE"),
    ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
    ("PMI_RANK", "PMI_SIZE"),
    ("RANK_ID", "RANK_SIZE"),
)


def launcher_rank() -> int | None:
    """The rank a launcher gave this process at start, if any."""
    if is_helper():
        return None
    for rank_var, size_var in _LAUNCHER_VARS:
        value = os.environ.get(rank_var, "").strip()
        if value.isdigit() and size_var in os.environ:
            return int(value)
    return None


# torch's own launchers start every rank as a process of its own and never train.
_TORCH_LAUNCHER_MODULES = ("torch.distributed.run", "torch.distributed.launch")
_OPTIONS_WITH_VALUE = ("-X", "-W", "-Q")


def is_torch_launcher() -> bool:
    """This process is torchrun (or `python -m torch.distributed.run`): it imports torch
    but only starts the ranks, so the probe's patches would cost its start-up (on the
    path to the first rank's start) and do nothing. Read from the command line the
    interpreter was given (sys.orig_argv), which `-m` has not rewritten yet when torch
    finishes importing."""
    words = list(getattr(sys, "orig_argv", sys.argv))[1:]
    i = 0
    while i < len(words):
        word = words[i]
        if word == "-m":
            return i + 1 < len(words) and words[i + 1] in _TORCH_LAUNCHER_MODULES
        if word.startswith("-m"):
            return word[2:] in _TORCH_LAUNCHER_MODULES
        if word == "-c" or word == "-":
            return False
        if word.startswith("-"):
            i += 2 if word in _OPTIONS_WITH_VALUE else 1
            continue
        return os.path.basename(word) == "torchrun"
    return False


class _AfterImport:
    """A meta-path finder that runs a callback right after a module finishes importing,
    so the patches cost nothing in processes that never import the framework."""

    def __init__(self, target: str, callback: Callable[[], object]) -> None:
        self.target, self.callback = target, callback

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name != self.target:
            return None
        sys.meta_path.remove(self)  # one shot; also keeps find_spec below from recursing
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        original_exec = spec.loader.exec_module
        callback = self.callback

        def exec_module(module: Any) -> None:
            original_exec(module)
            try:
                callback()
            except Exception as exc:  # the probe never stops the user's program
                print(f"syncdoctor: probe not installed: {type(exc).__name__}: {exc}", file=sys.stderr)

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


PROCS_DIR = os.path.join(".syncdoctor", "procs")  # in the run folder: which processes imported torch


def note_process(kind: str) -> None:
    """Leave a marker RUN_DIR/.syncdoctor/procs/{kind}.{pid} (one small file, once per
    process that imports the framework), so that `syncdoctor run` can tell, when no
    rank attached, whether any process got as far as importing it."""
    folder = run_dir()
    if not folder:
        return
    try:
        path = os.path.join(folder, PROCS_DIR)
        os.makedirs(path, exist_ok=True)
        with open(os.path.join(path, f"{kind}.{os.getpid()}"), "w") as fh:
            fh.write(" ".join(sys.argv)[:2000] + "\n")
    except OSError:
        pass


def when_imported(module: str, callback: Callable[[], object]) -> None:
    if module in sys.modules:
        callback()
    else:
        sys.meta_path.insert(0, _AfterImport(module, callback))
