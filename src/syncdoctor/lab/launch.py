"""Start N rank processes and make sure every one of them ends.

Each rank runs in its own session (process group), so it and anything it spawned
are ended by process-group id; nothing is ever looked up or killed by name. The
wait is bounded; Ctrl-C and SIGTERM end the ranks before they propagate.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def end_process_groups(procs: Sequence[subprocess.Popen[bytes]], grace_s: float = 3.0) -> None:
    """SIGTERM each process group, then SIGKILL what is left, then reap."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        alive = [p for p in procs if p.poll() is None]
        for p in alive:
            try:
                os.killpg(p.pid, sig)
            except (ProcessLookupError, PermissionError):
                pass
        deadline = time.monotonic() + grace_s
        while any(p.poll() is None for p in alive) and time.monotonic() < deadline:
            time.sleep(0.05)
    for p in procs:
        try:
            os.killpg(p.pid, signal.SIGKILL)  # grandchildren left in the group
        except (ProcessLookupError, PermissionError):
            pass
        p.wait()


def run_ranks(
    commands: Sequence[Sequence[str]], envs: Sequence[dict[str, str]], logs: Sequence[Path], timeout_s: float
) -> tuple[list[int | None], bool]:
    """Run one process per rank; returns their exit codes (None: ended by us) and
    whether the deadline was hit."""
    procs: list[subprocess.Popen[bytes]] = []
    files = []
    try:
        for cmd, env, log in zip(commands, envs, logs, strict=True):
            fh = open(log, "ab")  # noqa: SIM115 - closed in finally, after the ranks end
            files.append(fh)
            procs.append(
                subprocess.Popen(
                    list(cmd),
                    env=env,
                    stdout=fh,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,
                )
            )
        deadline = time.monotonic() + timeout_s
        while any(p.poll() is None for p in procs):
            if time.monotonic() > deadline:
                end_process_groups(procs)
                return [None if p.returncode and p.returncode < 0 else p.returncode for p in procs], True
            time.sleep(0.05)
        return [p.returncode for p in procs], False
    except BaseException:  # Ctrl-C, SIGTERM turned into SystemExit, anything: end the ranks first
        end_process_groups(procs)
        raise
    finally:
        end_process_groups(procs)
        for fh in files:
            fh.close()
