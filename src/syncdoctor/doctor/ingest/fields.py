"""What a single line says about who wrote it and when: launcher prefixes (which
rank), host names, timestamps. Shared by the loss and the event parsers."""

from __future__ import annotations

import calendar
import re
from dataclasses import dataclass

# Launchers that merge the output of many ranks tag each line:
#   [1,3]<stdout>: ...        mpirun --tag-output (job 1, rank 3)
#   [default0]: ...           torchrun --tee / --redirects (role "default", local rank 0)
#   [rank0]: ...              torch >= 2.2 prefixes its own C++/Python errors
#   (RayTrainWorker pid=615, ip=10.72.7.6) ...   Ray workers (host only)
# A rank has at most 7 digits: a longer number is not a rank (and overflows int64 columns).
_MPI_PREFIX = re.compile(r"\[\d+,(\d{1,7})\]<std(?:out|err)>:\s?")
# Role names are a closed list: "[step10]: ..." is a user's print, not a launcher tag.
_ROLE_PREFIX = re.compile(r"\[(rank|default|worker|trainer|proc|process)(\d{1,7})\]:\s?")
# torch's "[rankN]:" may come after a timestamp added by a log collector.
_RANK_PREFIX_ANYWHERE = re.compile(r"\[rank(\d{1,7})\]:\s?")
# A rank tag a logger formatter put in the line's header, anywhere near its start:
#   [rank: 0] (Lightning)   [RANK 1]   [worker 1]   [Rank 3]   [local_rank=2]
#   ... [train.py:1057] (2/4) ...   (icefall, k2, lhotse: rank/world size after the header)
_RANK_TAG = re.compile(
    r"\[(?:global_rank|local_rank|rank|worker|proc|process|gpu)\s*[:=#]?\s*(\d{1,7})\]"
    r"|(?:^|\]\s)\((\d{1,5})/(\d{1,5})\)\s",
    re.IGNORECASE,
)
RANK_TAG_CHARS = 160
_RAY_PREFIX = re.compile(r"\((?:\w+ )?pid=\d+(?:, ip=([\w.:-]+))?\)\s?")
# srun --label: "3: text". Only trusted when most of a file's lines carry it.
SRUN_PREFIX = re.compile(r"\s*(\d{1,5}): ")
# "gpu-node-3: text" - pdsh/DeepSpeed's multi-node runner and `srun` wrappers put the
# host name in front of every line. Only trusted when most of a file's lines carry
# it and the label looks like a host (a digit, "-" or "." in it, not a log level).
HOST_PREFIX = re.compile(r"([A-Za-z][\w.-]{0,62}): ")
_NOT_HOSTS = {"info", "warning", "warn", "error", "debug", "critical", "fatal", "note", "epoch", "step", "loss"}
# "host:pid:tid [dev] NCCL INFO ..." - NCCL_DEBUG lines name their host.
_NCCL_HOST = re.compile(r"([\w.-]+):\d+:\d+ \[\d+\] (?:\S+ )?NCCL ")


@dataclass
class Prefix:
    body: str  # the line without launcher prefixes
    rank: int | None = None
    host: str | None = None


def strip_prefixes(line: str, srun_labels: bool, host_labels: bool = False) -> Prefix:
    """Peel launcher prefixes off a line; the innermost rank wins (the most specific)."""
    rank: int | None = None
    host: str | None = None
    body = line
    if host_labels:
        m = HOST_PREFIX.match(body)
        if m is not None and _looks_like_host(m.group(1)):
            host = m.group(1)
            body = body[m.end() :]
    for _ in range(4):  # prefixes nest: "[default0]:[rank0]:[E1129 ...]"
        if not body:
            break
        first = body[0]
        m = None
        if first == "[":
            m = _MPI_PREFIX.match(body)
            if m:
                rank = int(m.group(1))
            else:
                m = _ROLE_PREFIX.match(body)
                if m:
                    rank = int(m.group(2))
        elif first == "(":
            m = _RAY_PREFIX.match(body)
            if m and m.group(1):
                host = m.group(1)
        elif srun_labels and (first.isdigit() or first == " "):
            m = SRUN_PREFIX.match(body)
            if m:
                rank = int(m.group(1))
        if not m:
            break
        body = body[m.end() :]
    if rank is None and "[rank" in body[:80]:
        m = _RANK_PREFIX_ANYWHERE.search(body, 0, 80)
        if m:
            rank = int(m.group(1))
            body = body[: m.start()] + body[m.end() :]
    if rank is None and _may_hold_rank_tag(body[:RANK_TAG_CHARS]):
        m = _RANK_TAG.search(body, 0, RANK_TAG_CHARS)
        if m is not None:
            if m.group(1) is not None:
                rank = int(m.group(1))
            elif int(m.group(2)) < int(m.group(3)):
                rank = int(m.group(2))
                a, b = m.span(2)
                body = body[: a - 1] + body[b + len(m.group(3)) + 2 :]  # drop "(i/n)": not a counter
    if host is None and "NCCL" in body:
        m = _NCCL_HOST.search(body, 0, 200)
        if m:
            host = m.group(1)
    return Prefix(body, rank, host)


def prefix_free(shape: str, srun_labels: bool, host_labels: bool) -> bool:
    """True when ``strip_prefixes`` takes nothing off any line of this shape: no
    launcher prefix, no "[rankN]:", no rank tag, no NCCL host. The prefix patterns
    bound digit runs only from above ({1,7}), so a line that matches one has a shape
    that matches it too; the shape is searched whole, not only the head the line is."""
    first = shape[:1]
    if not first or first in "[(" or (srun_labels and (first.isdigit() or first == " ")):
        return False
    if host_labels and HOST_PREFIX.match(shape):
        return False
    return "[rank" not in shape and "NCCL" not in shape and _RANK_TAG.search(shape) is None


# Timestamps, searched near the start of a line only (where loggers put them):
#   2026-11-29 10:12:01,123   2026-11-29T10:12:01.123Z   2025-05-21_15:43:03 (torchrun)
#   2025-03-10-09:40:38.720.000 (MindSpore/CANN: ms.us)   2026/11/29 10:12:01
#   E1129 10:12:01.123456 / [W112 01:48:44.27] (glog as printed by torch: no year)
_ISO_TIME = re.compile(
    r"(\d{4})[-/](\d\d)[-/](\d\d)[ T_-](\d\d):(\d\d):(\d\d)(?:[.,](\d{1,9}))?(?:\.(\d{1,6}))?"
    r"\s?(Z|[+-]\d\d:?\d\d)?(?![\d])"
)
_GLOG_TIME = re.compile(r"(?:^|[\s\[])[IWEF](\d{1,2})(\d\d) (\d\d):(\d\d):(\d\d)\.(\d{1,9})")
TIME_SEARCH_CHARS = 160


def _fraction(digits: str | None) -> float:
    return int(digits) / 10 ** len(digits) if digits else 0.0


def parse_time(text: str, year_hint: int | None) -> tuple[float | None, int | None]:
    """Unix time of the first timestamp near the start of ``text``, and its year.

    Naive timestamps are read as UTC: the times only need to order events across
    the files of one cluster, which share a time zone far more often than not.
    glog stamps carry no year; ``year_hint`` (from another line or the file's
    mtime) supplies it.
    """
    head = text[:TIME_SEARCH_CHARS]
    m = _ISO_TIME.search(head)
    if m:
        year, month, day, hh, mm, ss = (int(g) for g in m.groups()[:6])
        frac = _fraction(m.group(7))
        if m.group(8):  # MindSpore "…:38.720.000": milliseconds then microseconds
            frac += int(m.group(8)) / 10 ** (3 + len(m.group(8)))
        t = _to_unix(year, month, day, hh, mm, ss, frac)
        if t is not None and m.group(9) and m.group(9) != "Z":
            sign = 1 if m.group(9)[0] == "+" else -1
            tz = m.group(9)[1:].replace(":", "")
            t -= sign * (int(tz[:2]) * 3600 + int(tz[2:]) * 60)
        return t, (year if t is not None else None)
    if year_hint is not None:
        m = _GLOG_TIME.search(head)
        if m:
            month, day, hh, mm, ss = (int(g) for g in m.groups()[:5])
            return _to_unix(year_hint, month, day, hh, mm, ss, _fraction(m.group(6))), None
    return None, None


def _to_unix(year: int, month: int, day: int, hh: int, mm: int, ss: int, frac: float) -> float | None:
    if not (1970 <= year <= 2200 and 1 <= month <= 12 and 1 <= day <= 31 and hh < 24 and mm < 60 and ss <= 60):
        return None
    return calendar.timegm((year, month, day, hh, mm, ss, 0, 0, 0)) + frac


def _may_hold_rank_tag(head: str) -> bool:
    """A cheap gate before the rank-tag regex: the words it needs, or "(i/n)"."""
    if "/" in head and ")" in head:
        return True
    low = head.lower()
    return any(w in low for w in ("rank", "worker", "proc", "gpu"))


def _looks_like_host(label: str) -> bool:
    return label.lower() not in _NOT_HOSTS and any(c.isdigit() or c in "-." for c in label)


def detect_host_labels(lines: list[str | None]) -> bool:
    """True when most non-empty lines start with a host-name label "gpu-node-3: "."""
    texts = [t for t in lines if t]
    if len(texts) < 4:
        return False
    hits = 0
    for t in texts:
        m = HOST_PREFIX.match(t)
        hits += bool(m and _looks_like_host(m.group(1)))
    return hits >= 0.6 * len(texts)


def detect_srun_labels(lines: list[str | None]) -> bool:
    """True when most non-empty lines start with an srun --label "N: " prefix."""
    texts = [t for t in lines if t]
    if len(texts) < 4:
        return False
    hits = sum(1 for t in texts if SRUN_PREFIX.match(t))
    return hits >= 0.6 * len(texts)
