"""Lab ranks forked from one interpreter that has imported torch already.

A lab rank is a fresh Python that imports numpy, torch, its distributed package and
dynamo (DDP's constructor imports it) before its first step: 2-4 s of CPU each on a
2-core machine, most of a short lab run. The fork server imports them once; each rank
is then a fork of it that runs the rank's module as `__main__`, in a session of its
own, with its own environment, working folder and log. The ranks stay separate
processes with a real process group between them; what they share is the start-up.

What a fresh interpreter gives each rank and a fork would not is given again in the
child: its own random seeds (Python's, numpy's global one and torch's default
generator, which torch seeds from the OS at import), default signal handlers, and
the exit of a normal interpreter (atexit handlers, flushed streams). One thing can't
be given again: the string hash seed is the server's in every rank. The runner uses
the server only where nothing else must run at interpreter start: under `syncdoctor
run` its generated sitecustomize does, so the ranks are spawned there, as before.

The protocol is JSON lines. The client writes {"id", "module", "argv", "env", "cwd",
"log"}; the server answers {"id", "pid"} (or {"id", "error"}) and, when a rank ends,
{"pid", "code"} (a negative code: ended by that signal). When its input closes (the
runner ended, however), the server ends every rank still running and exits.
"""

from __future__ import annotations

import atexit
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

START_TIMEOUT_S = 180.0  # the server's own imports, on a loaded 2-core machine


# -----------------------------------------------------------------------------
# the server: `python -m syncdoctor.lab.forkserver`


def _serve() -> None:
    # What every lab rank imports before its first step, the costly part of its
    # start-up: once, here, for all of them.
    import numpy  # noqa: F401
    import torch._dynamo  # noqa: F401
    import torch.distributed  # noqa: F401
    import torch.nn.parallel  # noqa: F401
    import torch.utils.data  # noqa: F401

    replies = os.fdopen(os.dup(1), "w", buffering=1)
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 1)  # nothing the server itself prints can break the protocol
    live: set[int] = set()
    pending = b""
    try:
        while True:
            readable, _, _ = select.select([0], [], [], 0.05)
            if readable:
                chunk = os.read(0, 1 << 16)
                if not chunk:
                    return  # the runner is gone
                pending += chunk
                *lines, pending = pending.split(b"\n")
                for line in lines:
                    if line.strip():
                        replies.write(json.dumps(_start(json.loads(line), live, replies, devnull)) + "\n")
            while live:
                pid, status = os.waitpid(-1, os.WNOHANG)
                if pid == 0:
                    break
                live.discard(pid)
                replies.write(json.dumps({"pid": pid, "code": os.waitstatus_to_exitcode(status)}) + "\n")
    finally:
        for pid in live:
            _end_group(pid, signal.SIGKILL)


def _start(request: dict[str, Any], live: set[int], replies: Any, devnull: int) -> dict[str, Any]:
    try:
        log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    except OSError as error:
        return {"id": request["id"], "error": f"cannot open the rank's log: {error}"}
    pid = os.fork()
    if pid == 0:
        replies.close()
        _run_rank(request, log, devnull)  # never returns
    os.close(log)
    live.add(pid)
    return {"id": request["id"], "pid": pid}


def _run_rank(request: dict[str, Any], log: int, devnull: int) -> None:
    """In the forked child: become the rank's own process, run its module, exit."""
    code: int = 1
    try:
        os.setsid()  # its own session and process group, as the spawning runner gives it
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGCHLD, signal.SIGPIPE):
            signal.signal(sig, signal.default_int_handler if sig == signal.SIGINT else signal.SIG_DFL)
        os.dup2(devnull, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(log)
        sys.stdout.reconfigure(write_through=True)  # type: ignore[union-attr]
        sys.stderr.reconfigure(write_through=True)  # type: ignore[union-attr]
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        _reseed()
        import runpy

        sys.argv = [request["module"], *request["argv"]]
        runpy.run_module(request["module"], run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as done:
        code = _exit_code(done.code)
    except BaseException:
        # As the interpreter reports an uncaught exception (PyErr_Print): sys.last_*
        # set, which the probe's exit handler reads to record how the rank ended, then
        # sys.excepthook.
        kind, error, tb = sys.exc_info()
        sys.last_type, sys.last_value, sys.last_traceback = kind, error, tb
        if sys.version_info >= (3, 12):
            sys.last_exc = error
        sys.excepthook(kind, error, tb)  # type: ignore[arg-type]
        code = 1
    finally:
        try:
            atexit._run_exitfuncs()
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _reseed() -> None:
    """Fresh seeds, as a new interpreter draws them (a fork copies the server's)."""
    import random

    import numpy as np
    import torch

    random.seed()
    np.random.seed()
    torch.seed()


def _exit_code(code: object) -> int:
    """What Python's own exit makes of `sys.exit(code)`."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


def _end_group(pid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


# -----------------------------------------------------------------------------
# the client


class ForkServerError(RuntimeError):
    """The server could not be started or could not start a rank."""


class ForkServer:
    """One server process and the ranks it forked. Thread-safe: the runs a test session
    starts ahead share it."""

    def __init__(self) -> None:
        env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "syncdoctor.lab.forkserver"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
        )
        self._lock = threading.Condition()
        self._next_id = 0
        self._started: dict[int, int | str] = {}  # request id -> pid, or why not
        self._codes: dict[int, int] = {}  # pid -> exit code
        self._reader = threading.Thread(target=self._read, name="forkserver", daemon=True)
        self._reader.start()

    @property
    def alive(self) -> bool:
        return self._proc.poll() is None

    def _read(self) -> None:
        assert self._proc.stdout is not None
        for line in self._proc.stdout:
            reply = json.loads(line)
            with self._lock:
                if "id" in reply:
                    self._started[reply["id"]] = reply.get("pid", reply.get("error", "no pid"))
                else:
                    self._codes[reply["pid"]] = reply["code"]
                self._lock.notify_all()
        with self._lock:
            self._lock.notify_all()

    def start(self, module: str, argv: Sequence[str], env: dict[str, str], log: Path) -> int:
        """Forks one rank running `python -m module *argv`; returns its pid (also its
        process group)."""
        with self._lock:
            request_id = self._next_id
            self._next_id += 1
            request = {"id": request_id, "module": module, "argv": list(argv), "env": env}
            request.update({"cwd": os.getcwd(), "log": str(Path(log).resolve())})
            assert self._proc.stdin is not None
            try:
                self._proc.stdin.write((json.dumps(request) + "\n").encode())
                self._proc.stdin.flush()
            except OSError as error:
                raise ForkServerError(f"the fork server is gone: {error}") from error
            deadline = time.monotonic() + START_TIMEOUT_S
            while request_id not in self._started:
                if not self.alive or time.monotonic() > deadline:
                    raise ForkServerError("the fork server did not start the rank")
                self._lock.wait(0.5)
            started = self._started.pop(request_id)
        if isinstance(started, str):
            raise ForkServerError(started)
        return started

    def exit_code(self, pid: int) -> int | None:
        """The rank's exit code once it ended (None while it runs). A rank whose server
        died is reported as ended by SIGKILL: the server ends its ranks as it goes."""
        with self._lock:
            if pid in self._codes:
                return self._codes[pid]
        return None if self.alive else -signal.SIGKILL

    def wait(self, timeout_s: float) -> None:
        with self._lock:
            self._lock.wait(timeout_s)

    def close(self) -> None:
        if self._proc.stdin is not None:
            self._proc.stdin.close()  # the server ends what still runs and exits
        try:
            self._proc.wait(10)
        except subprocess.TimeoutExpired:
            _end_group(self._proc.pid, signal.SIGKILL)
            self._proc.wait()


_server: ForkServer | None = None
_server_lock = threading.Lock()


def shared_server() -> ForkServer:
    """This process's fork server, started at the first call (again if it died)."""
    global _server
    with _server_lock:
        if _server is None or not _server.alive:
            _server = ForkServer()
            atexit.register(_server.close)
        return _server


def run_forked_ranks(
    server: ForkServer,
    module: str,
    argvs: Sequence[Sequence[str]],
    envs: Sequence[dict[str, str]],
    logs: Sequence[Path],
    timeout_s: float,
) -> tuple[list[int | None], bool]:
    """As lab.launch.run_ranks, with the ranks forked by `server`: their exit codes
    (None: ended by us) and whether the deadline was hit. Every rank started is ended
    by its process group before this returns."""
    pids: list[int] = []
    try:
        for argv, env, log in zip(argvs, envs, logs, strict=True):
            pids.append(server.start(module, argv, env, log))
        deadline = time.monotonic() + timeout_s
        while any(server.exit_code(pid) is None for pid in pids):
            if time.monotonic() > deadline:
                _end_ranks(server, pids)
                codes = [server.exit_code(pid) for pid in pids]
                return [None if code is None or code < 0 else code for code in codes], True
            server.wait(0.1)
        return [server.exit_code(pid) for pid in pids], False
    finally:
        _end_ranks(server, pids)


def _end_ranks(server: ForkServer, pids: Sequence[int], grace_s: float = 3.0) -> None:
    """SIGTERM the process group of each rank still running, then SIGKILL, then SIGKILL
    every group again for what the ranks started and left behind."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        alive = [pid for pid in pids if server.exit_code(pid) is None]
        for pid in alive:
            _end_group(pid, sig)
        deadline = time.monotonic() + grace_s
        while any(server.exit_code(pid) is None for pid in alive) and time.monotonic() < deadline:
            server.wait(0.05)
    for pid in pids:
        _end_group(pid, signal.SIGKILL)


if __name__ == "__main__":
    _serve()
