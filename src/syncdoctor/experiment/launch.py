"""Running one variant of the user's job, and leaving nothing behind.

Each rerun goes through the same machinery as `syncdoctor run` (probe/run/launcher.py: the
generated sitecustomize, the rank logs, the subreaper), with two differences:

- the launcher starts in a session of its own, so it and everything in its process
  group is ended by process-group id; launchers whose ranks start sessions of their
  own (the lab does) leave processes outside that group: those are found by walking
  /proc from the launcher down (parent pids) before anything is killed, and once the
  launcher is gone they are re-parented to this process (the subreaper), so they are
  found and ended there too. Nothing is ever looked up by name.
- the job stops after N optimizer steps without a code change: STOP_AFTER_ENV makes
  every rank close its records after step N and exit (probe/torch/probe.py). When every
  rank has closed its records and the launcher is still there after GRACE_S (a rank
  that did not stop: a step that is not an optimizer step, a launcher that restarts
  workers), the run is ended from here.

The command's own output goes to RUN/.syncdoctor/launcher.log (each rank's also to
RUN/logs/rank{R}.log, as under `syncdoctor run`), so the terminal shows the table.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from syncdoctor.probe.run import launcher
from syncdoctor.settings import RUN_DIR_ENV, STOP_AFTER_ENV

GRACE_S = 20.0  # every rank closed its records: how long the launcher gets to exit
TERM_WAIT_S = 5.0  # between SIGTERM and SIGKILL
LAUNCHER_LOG = Path(".syncdoctor") / "launcher.log"


@dataclass
class RunResult:
    folder: Path
    returncode: int | None = None  # None: ended from here
    timed_out: bool = False
    ended_by_us: bool = False  # every rank stopped but the launcher lingered
    seconds: float = 0.0
    left: list[int] = field(default_factory=list)  # pids still alive at the end: must stay empty


def run_variant(
    command: list[str],
    folder: Path,
    *,
    env_extra: dict[str, str],
    steps: int | None,
    check_every: int | None,
    timeout_s: float,
) -> RunResult:
    """Run `command` once with the probe attached, into `folder`; always returns with
    every process it started ended and reaped (also on KeyboardInterrupt/SystemExit,
    which are re-raised)."""
    folder = folder.resolve()
    env = launcher.prepare(folder, check_every, None)
    env.update(env_extra)
    if steps:
        env[STOP_AFTER_ENV] = str(steps)
    meta = {"command": command, "cwd": os.getcwd(), "start": time.time(), "python": sys.executable, "env": env_extra}
    (folder / "run.json").write_text(json.dumps(meta, indent=1))
    launcher.become_subreaper()
    result = RunResult(folder)
    t0 = time.monotonic()
    with open(folder / LAUNCHER_LOG, "ab") as log:
        try:
            proc = subprocess.Popen(
                command, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        except OSError as exc:
            log.write(f"syncdoctor: {command[0]}: {exc.strerror}\n".encode())
            result.returncode = 127 if isinstance(exc, FileNotFoundError) else 126
            return result
        try:
            result.returncode, result.timed_out, result.ended_by_us = _wait(proc, folder, timeout_s)
        finally:
            result.left = end_everything(proc)
    result.seconds = time.monotonic() - t0
    meta.update({"end": time.time(), "returncode": result.returncode, "still_running": result.left})
    (folder / "run.json").write_text(json.dumps(meta, indent=1))
    return result


def _wait(proc: subprocess.Popen[bytes], folder: Path, timeout_s: float) -> tuple[int | None, bool, bool]:
    deadline = time.monotonic() + timeout_s
    all_closed_at: float | None = None
    while True:
        code = proc.poll()
        if code is not None:
            return code, False, False
        now = time.monotonic()
        if now > deadline:
            return None, True, False
        if all_closed_at is None and ranks_closed(folder):
            all_closed_at = now
        if all_closed_at is not None and now - all_closed_at > GRACE_S:
            return None, False, True
        time.sleep(0.1)


def ranks_closed(folder: Path) -> bool:
    """Whether every rank that wrote records has written its end record (the probe
    writes it last, when it closes)."""
    files = list((folder / "records").glob("rank*.jsonl"))
    if not files:
        return False
    for path in files:
        try:
            with open(path, "rb") as fh:
                fh.seek(max(0, path.stat().st_size - 4096))
                tail = fh.read()
        except OSError:
            return False
        if b'"kind":"end"' not in tail.replace(b" ", b""):
            return False
    return True


# ---------------------------------------------------------------------- ending processes
def _parents() -> dict[int, int]:
    """pid -> parent pid of every process on this machine we can see."""
    out: dict[int, int] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as fh:
                stat = fh.read()
        except OSError:
            continue
        # The name field may hold spaces and parentheses: split after its last ')'.
        fields = stat[stat.rfind(b")") + 2 :].split()
        if len(fields) > 1 and fields[0] != b"Z":
            out[int(entry.name)] = int(fields[1])
    return out


def descendants(root: int) -> set[int]:
    """Every live process below `root` (by parent pid), `root` not included."""
    parents = _parents()
    below: dict[int, list[int]] = {}
    for pid, ppid in parents.items():
        below.setdefault(ppid, []).append(pid)
    found: set[int] = set()
    stack = [root]
    while stack:
        for child in below.get(stack.pop(), []):
            if child not in found:
                found.add(child)
                stack.append(child)
    return found


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read()
    except OSError:
        return False
    return stat[stat.rfind(b")") + 2 :][:1] != b"Z"


def _groups(pids: set[int]) -> set[int]:
    own = os.getpgrp()
    groups = set()
    for pid in pids:
        with contextlib.suppress(OSError):
            group = os.getpgid(pid)
            if group != own:  # never our own group: that would end this process and its caller
                groups.add(group)
    return groups


def _reap() -> None:
    """Collect every child of ours that has ended (orphans re-parented to us included)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def end_everything(proc: subprocess.Popen[bytes]) -> list[int]:
    """End the launcher, its process group, every process below it and every orphan
    re-parented to us: SIGTERM, a bounded wait, then SIGKILL; reap them all. Returns the
    pids still alive after that (none, unless a process ignores SIGKILL in the kernel).
    A second Ctrl-C does not cut this short (it is bounded: about 2 × 5 s + 7 s)."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        return _end_everything(proc)
    previous = {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        return _end_everything(proc)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def _end_everything(proc: subprocess.Popen[bytes]) -> list[int]:
    tracked = descendants(proc.pid) | {proc.pid}
    if proc.poll() is None or len(tracked) > 1:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            tracked |= descendants(proc.pid) | set(launcher.children())
            for group in _groups(tracked) | ({proc.pid} if proc.poll() is None else set()):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(group, sig)
            deadline = time.monotonic() + TERM_WAIT_S
            while time.monotonic() < deadline:
                proc.poll()
                _reap()
                if not any(_alive(p) for p in tracked):
                    break
                time.sleep(0.05)
            if not any(_alive(p) for p in tracked):
                break
    with contextlib.suppress(Exception):
        proc.wait(timeout=TERM_WAIT_S)
    # Orphans the launcher left (re-parented to us as subreaper): tee processes draining
    # a rank's last lines end by themselves; anything else is ended by its group.
    left = launcher.reap_orphans(2.0)
    for pid in left:
        with contextlib.suppress(OSError):
            group = os.getpgid(pid)
            if group != os.getpgrp():
                os.killpg(group, signal.SIGKILL)
            else:
                os.kill(pid, signal.SIGKILL)
    if left:
        launcher.reap_orphans(TERM_WAIT_S)
    return sorted(p for p in tracked | set(left) if _alive(p))


def in_run(folder: Path) -> list[int]:
    """Processes of this user whose environment names `folder` as their run folder
    (every process a variant started inherits it): for checks that nothing is left."""
    wanted = f"{RUN_DIR_ENV}={folder.resolve()}".encode()
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry.name}/environ", "rb") as fh:
                env = fh.read().split(b"\0")
        except OSError:
            continue
        if wanted in env and _alive(int(entry.name)):
            found.append(int(entry.name))
    return found
