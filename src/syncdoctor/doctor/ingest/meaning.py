"""What an event line means, read from the communicator's or launcher's own words.

The event classifier (events.py) says what kind of line it is; these functions
read the facts the line states, so the rules can reason about mechanisms instead
of matching phrases: which ranks share a device, which ranks never submitted a
collective, which rank's gradients were incomplete, which peer process went away
first, where the loss scale went. Each takes ``Event.raw`` and returns None when
the line does not state that fact.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from syncdoctor.doctor.model import Event

_DUPLICATE_GPU = re.compile(
    r"Duplicate GPU detected\s*:\s*rank (\d+) and rank (\d+) both on CUDA device (\w+)", re.IGNORECASE
)
_MISSING = re.compile(r"\[missing ranks:\s*([\d,\s]+)\]", re.IGNORECASE)
_READY = re.compile(r"\[ready ranks:\s*([\d,\s]+)\]", re.IGNORECASE)
_NO_GRAD = re.compile(r"did not receive grad for rank (\d+)", re.IGNORECASE)
_MISMATCH_RANKS = re.compile(r"Rank (\d+) is running (?:inconsistent )?collective", re.IGNORECASE)
_PEER_CLOSED = re.compile(r"Connection closed by localRank (\d+)", re.IGNORECASE)
_SCALE_FROM_TO = re.compile(
    r"(?:loss scale|scale)\s*:?\s*([\d.eE+]+),?\s*(?:but hysteresis.*|reducing to\s*([\d.eE+]+))", re.IGNORECASE
)
_SCALE_TO = re.compile(r"(?:reducing loss scale to|loss scale adjust to|reducing to)\s*([\d.eE+]+)", re.IGNORECASE)
_SKIP_COUNTER = re.compile(r"\bstep=(\d+), skipped=(\d+)")
_WORKER_EXIT = re.compile(r"worker(?: process \d+)? exits? with exception|kill all other workers", re.IGNORECASE)
# A process ended by a signal. SIGABRT (-6) is left out: under torch it is the NCCL
# watchdog tearing a process down after a collective timed out, a consequence.
_SIGNAL_EXIT = re.compile(
    r"exitcode\s*:\s*-(?!6\b)\d+|signal (?!6\b)\d+ \(SIG\w+\) received|killed by signal", re.IGNORECASE
)


def duplicate_device(raw: str) -> tuple[int, int, str] | None:
    """NCCL's "Duplicate GPU detected : rank A and rank B both on CUDA device D"."""
    m = _DUPLICATE_GPU.search(raw)
    return (int(m.group(1)), int(m.group(2)), m.group(3)) if m else None


def _ints(text: str) -> set[int]:
    return {int(x) for x in re.findall(r"\d+", text)}


def stalled_ranks(raw: str) -> tuple[set[int], set[int]]:
    """Horovod's stall report: (ranks missing from a collective, ranks ready in it)."""
    missing: set[int] = set()
    ready: set[int] = set()
    for m in _MISSING.finditer(raw):
        missing |= _ints(m.group(1))
    for m in _READY.finditer(raw):
        ready |= _ints(m.group(1))
    return missing, ready


def no_grad_rank(raw: str) -> int | None:
    """DDP's reducer: the rank whose parameters did not receive gradients."""
    m = _NO_GRAD.search(raw)
    return int(m.group(1)) if m else None


def mismatch_ranks(raw: str) -> set[int]:
    """torch's DETAIL report: the ranks named as running differing collectives."""
    return {int(m.group(1)) for m in _MISMATCH_RANKS.finditer(raw)}


def peer_closed(raw: str) -> int | None:
    """NCCL's proxy thread: a local peer (by local rank) closed its connection."""
    m = _PEER_CLOSED.search(raw)
    return int(m.group(1)) if m else None


def worker_failed(raw: str) -> bool:
    """A launcher reports a worker that ended abnormally (msrun's worker exception,
    torchrun's negative exit code, a signal): the process died, the network did not."""
    return bool(_WORKER_EXIT.search(raw) or _SIGNAL_EXIT.search(raw))


@dataclass
class ScaleStep:
    scale: float | None  # the loss scale after this line (None: not stated)
    at_minimum: bool = False  # the scaler gave up: it cannot go lower
    skip_counter: tuple[int, int] | None = None  # DeepSpeed's (step, skipped)


def loss_scale(raw: str) -> ScaleStep | None:
    """A loss-scaler line: where the scale went, or the skip counter."""
    low = raw.lower()
    if "loss scale already at minimum" in low or "cannot decrease scale" in low:
        return ScaleStep(None, at_minimum=True)
    m = _SKIP_COUNTER.search(raw)
    if m:
        return ScaleStep(None, skip_counter=(int(m.group(1)), int(m.group(2))))
    m = _SCALE_TO.search(raw)
    if m:
        return ScaleStep(_float(m.group(1)))
    m = _SCALE_FROM_TO.search(raw)
    if m:
        return ScaleStep(_float(m.group(2) or m.group(1)))
    return ScaleStep(None) if "overflow" in low else None


def _float(text: str) -> float | None:
    try:
        return float(text.rstrip("."))
    except ValueError:
        return None


def launcher_failures(events: list[Event]) -> list[Event]:
    """Exit events that say a process died: a peer's closed connection, a worker's
    exception reported by msrun, a signal reported by torchrun/mpirun."""
    return [
        e
        for e in events
        if e.kind == "exit" and not e.benign and (peer_closed(e.raw) is not None or worker_failed(e.raw))
    ]


def _precedes(a: Event, b: Event) -> bool:
    """Whether ``a`` happened before ``b``: by time when both carry one, else by
    position in the same file; events of different untimed files are unordered
    (treated as not before)."""
    if a.t is not None and b.t is not None:
        return a.t <= b.t
    if a.source == b.source and a.line is not None and b.line is not None:
        return a.line < b.line
    return False


def first_process_failure(events: list[Event]) -> Event | None:
    """The earliest sign that a process died on its own (a crash, an OOM, a peer
    that closed its connection, a worker the launcher saw fail) and that came
    before the first communication timeout: the survivors' timeouts are then its
    consequence. None when the communication failure came first."""
    real = [e for e in events if not e.benign and e.kind != "info"]
    comm = [e for e in real if e.kind in ("timeout", "watchdog", "network")]
    failures = [e for e in real if e.kind in ("crash", "oom")] + launcher_failures(real)
    if not failures:
        return None
    timed = [e for e in failures if e.t is not None]
    first = min(timed, key=lambda e: e.t or 0.0) if timed else min(failures, key=lambda e: (e.source, e.line or 0))
    if comm and any(_precedes(c, first) for c in comm):
        return None
    return first


# Work that runs on one rank (or a few) while the others go on to a collective:
# saving, evaluating, finishing, preprocessing data. Said in the log line just
# before the survivors' collective timed out, it names the stall.
_ONE_SIDED_WORK = re.compile(
    r"\bsav(?:e|ing)\b.{0,40}?\b(?:checkpoint|model|weights|state)|\bcheckpoint\b.{0,20}?\bsav"
    r"|\bevaluat(?:e|ing|ion)\b|\bvalidat(?:e|ing|ion)\b|\btesting\b|\.fit` stopped|training (?:finished|complete)"
    r"|\b(?:map|tokeniz\w*|preprocess\w*|download\w*|indexing|init)\b.{0,200}?\d+%\|"
    r"|\d+%\|.{0,200}?(?:MB/s|GB/s|examples/s|ba/s)",
    re.IGNORECASE,
)
_NOT_ACTIVITY = re.compile(r"^\s*(?:File \"|frame #|Traceback|\w*Error|Exception raised|\.\.\.\s*$)|NCCL INFO")
MAX_LOOKBACK_BYTES = 256 << 20


def one_sided_work_before(source: str, line: int, lookback: int = 12) -> str | None:
    """The line, among the few before ``line`` in ``source``, that says a rank was
    busy with work of its own (saving, evaluating, preprocessing); None if none."""
    import os
    from collections import deque

    try:
        if os.path.getsize(source) > MAX_LOOKBACK_BYTES:
            return None
        window: deque[str] = deque(maxlen=lookback)
        with open(source, encoding="utf-8", errors="replace") as f:
            for number, text in enumerate(f, start=1):
                if number >= line:
                    break
                if text.strip() and not _NOT_ACTIVITY.search(text):
                    window.append(text.rstrip("\n"))
    except OSError:
        return None
    for text in reversed(window):
        if _ONE_SIDED_WORK.search(text):
            return text.strip()
    return None
