"""Communication and process events: which lines are timeouts, retries, watchdog
firings, network errors, crashes, OOMs, collective mismatches, configuration
errors, exits, or notable information.

The rules are data, checked in order (first match wins): the specific before the
generic, and known-benign noise first of all, so that e.g. MindSpore's start-up
"Topology build timed out., retry(3/120)" never counts as a timeout.

Kinds (``Event.kind``):
  timeout        an operation waited too long: a collective, a connect, a recv,
                 HCCL execute/connect timeouts (EI0002, EI0006), msrun node time-outs
  watchdog       a watchdog fired: "Watchdog caught collective operation timeout",
                 heartbeat monitors, ncclCommWatchdog, HCCL watchdogs
  retry          something was retried (a connect, an HCCL operation, msrun start-up)
  network        the transport failed: connection closed/refused/reset, NCCL system,
                 internal or remote errors, IB/socket errors, HCCL link errors
  crash          a process died abnormally: the exception ending a traceback, a
                 segfault, a fatal signal, a kernel launch that failed
  oom            out of host or device memory (CUDA, NPU, DefaultCPUAllocator, OOM killer)
  mismatch       ranks disagreed: collective mismatch, DDP reducer errors (parameters
                 that did not receive gradients), Horovod's stalled-tensor report
                 (a subset of ranks submitted a collective), HCCL parameter
                 inconsistency (EI0005), the playbook's GRADIENT_SYNC line
  configuration  the setup is wrong: device busy or in use, address in use, bad rank
                 table, invalid usage, duplicate GPU, a MindSpore cluster role or
                 node count that does not match the launch
  exit           a launcher saw a process end: torchrun ChildFailedError and its
                 summary block, msrun "Worker process ... exit with exception",
                 "kill all other workers", srun/mpirun exit codes
  overflow       mixed precision skipped a step for inf/NaN gradients, or the loss
                 scale reached its floor (DeepSpeed, apex, MindSpore loss-scale
                 cells); whether that is warm-up or a fault is for the rules
  error          a line its logger marked ERROR/FATAL/CRITICAL that no rule above
                 names, or a traceback's first line (the traceback may be cut
                 before its exception): something failed, what is not said
  warning        a line its logger marked WARNING that no rule above names (benign:
                 said among what a log holds, never a failure)
  info           notable but not a failure: NCCL communicator set-up lines (benign),
                 the playbook's "[WARNING] Loss shows abnormal fluctuation" line
                 (kept as info, not benign: it is a symptom the doctor weighs)
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

EVENT_KINDS = (
    "timeout",
    "retry",
    "watchdog",
    "network",
    "crash",
    "oom",
    "mismatch",
    "configuration",
    "exit",
    "overflow",
    "error",
    "warning",
    "info",
)


@dataclass(frozen=True)
class Rule:
    name: str
    kind: str | None  # None: recognised chatter, not an event
    anchors: tuple[str, ...]  # lower-case substrings; the line must hold one (a cheap gate)
    regex: re.Pattern[str] | None = None  # searched in the line without launcher prefixes
    benign: bool = False


# Repetitions in these patterns are bounded ({0,300}, not .*): a line is up to
# PARSE_CHARS long and may be hostile, and unbounded backtracking would be quadratic.
def _re(pattern: str, flags: int = re.IGNORECASE) -> re.Pattern[str]:
    return re.compile(pattern, flags)


# Named groups a rule's regex may set: "rank" (the rank the line is about, e.g. the
# failed rank in a launcher summary: beats every other source), "inrank" (a rank
# the reporting process names for itself: used only when nothing better is known),
# "host".
RULES: tuple[Rule, ...] = (
    # --- known-benign noise and chatter ------------------------------------------------
    Rule("ms_topology_retry", "retry", ("topology build timed out",), benign=True),
    Rule("ms_finalize_retry", "retry", ("retry to finalize",), benign=True),
    # msrun workers wait for the scheduler at start-up: "Failed to register and try to
    # reconnect to the meta server" repeats until it is up (seen on every healthy job).
    Rule("ms_register_reconnect", "retry", ("reconnect to the meta server",), benign=True),
    # The msrun scheduler logs every worker's disconnect; "errno: 0 Success" is a worker
    # that finished, not a failed link.
    Rule("ms_socket_closed_ok", "network", ("errno: 0 success",), benign=True),
    # errno 11 (EAGAIN) on a non-blocking socket means "no data yet, try again": the
    # scheduler logs it as a WARNING while the cluster forms. Taken for a failure it came
    # before a real crash and made the crash look like a consequence (a flaky CI run).
    Rule(
        "ms_socket_eagain",
        "network",
        ("errno: 11 resource temporarily unavailable",),
        _re(r"\[WARNING\].{0,300}SocketEventHandler"),
        benign=True,
    ),
    Rule("ms_analyzing", "info", ("analyzing exception log",), benign=True),
    # InfiniBand subnet-manager notices NCCL relays as WARN: the port stays up.
    Rule("nccl_ib_reregistration", "network", ("client reregistration",), benign=True),
    Rule(
        "cann_advice",
        None,
        ("solution", "possible cause"),
        _re(r"^\s*(?:Solution|Possible Cause)\s*:"),
    ),
    # source lines quoted in a traceback ("    raise RuntimeError('Timed out')") are code, not events
    Rule(
        "traceback_code",
        None,
        ("raise", 'file "', "return"),
        _re(r"^\s+(?:raise\b|File \"|return\b)", 0),
    ),
    Rule(
        "nccl_info_error_trace",
        "network",
        ("nccl info",),
        _re(r"NCCL INFO \S+\.(?:cc|h|cu):\d+ -> [1-9]"),
    ),
    Rule("nccl_info_retry", "retry", ("nccl info",), _re(r"NCCL INFO .{0,400}?\bretry")),
    Rule("nccl_info_abort", "exit", ("nccl info",), _re(r"NCCL INFO .{0,400}?\babort")),
    # NCCL's proxy service thread sees a local peer process close its connection:
    # that process ended (crashed or was killed) before the others.
    Rule(
        "nccl_peer_closed",
        "exit",
        ("connection closed by localrank",),
        _re(r"Connection closed by localRank (?P<peer>\d+)"),
    ),
    Rule(
        "nccl_info_comm",
        "info",
        ("nccl info",),
        _re(r"NCCL INFO (?:.{0,400}?\bcomm 0x[0-9a-f]+ rank (?P<inrank>\d+) nranks \d+|NCCL version|Using network)"),
        benign=True,
    ),
    Rule("nccl_info_other", None, ("nccl info",)),  # channels, rings, trees: set-up chatter
    # --- ranks disagree -------------------------------------------------------------------
    Rule("gradient_sync", "mismatch", ("gradient_sync",)),
    Rule("loss_fluctuation", "info", ("abnormal fluctuation",)),
    Rule(
        "collective_mismatch",
        "mismatch",
        ("mismatch between collectives", "collective mismatch", "mismatched collective"),
    ),
    Rule(
        "ddp_reducer",
        "mismatch",
        (
            "expected to have finished reduction",
            "expected to mark a variable ready only once",
            "appears not to match sizes of the same param",
            "did not receive grad for rank",
            "were not used in producing loss",
            "marked as ready twice",
        ),
    ),
    # Horovod: "Mismatched ALLREDUCE tensor shapes", "... CPU/GPU device selection"
    Rule("horovod_mismatch", "mismatch", ("mismatched allreduce", "mismatched allgather", "mismatched broadcast")),
    # Horovod: "One or more tensors were submitted to be reduced, gathered or
    # broadcasted by subset of ranks ... Stalled ops: X [missing ranks: 1]"
    Rule(
        "horovod_stall",
        "mismatch",
        ("subset of ranks", "stalled ops", "missing ranks:", "ready ranks:"),
    ),
    Rule("hccl_inconsistent", "mismatch", ("ei0005",)),
    # --- mixed precision ----------------------------------------------------------------------
    Rule(
        "loss_scale",
        "overflow",
        ("overflow", "loss scale already at minimum"),
        _re(r"overflow|loss scale already at minimum"),
    ),
    Rule("skip_counter", "overflow", ("skipped=",), _re(r"\bstep=\d+, skipped=\d+")),
    # --- memory -----------------------------------------------------------------------------
    Rule(
        "oom",
        "oom",
        ("memory", "oom"),
        _re(
            r"out of memory|outofmemory|memoryerror|can'?t allocate memory|cannot allocate memory"
            r"|not enough memory|memory (?:is |isn'?t )?(?:not )?enough|insufficient memory|oom[-_ ]?kill|\boom\b"
            r"|alloc\w*\s+(?:device\s+)?memory\s+fail|memory\s+alloc\w*\s+fail|fail\w* to alloc\w* (?:\w+ )?memory"
        ),
    ),
    # --- watchdogs and timeouts ---------------------------------------------------------------
    # A CUDA fault reported by the watchdog thread ("watchdog thread terminated with
    # exception: CUDA error: an illegal memory access") is the process's own crash.
    Rule("cuda_error", "crash", ("cuda error",), _re(r"CUDA error: (?!out of memory|invalid device)")),
    Rule("watchdog", "watchdog", ("watchdog", "heartbeat monitor")),
    Rule("msrun_timeout_nodes", "timeout", ("time out nodes are",)),
    # The rendezvous cannot be reached or found at all: a launch address, name or
    # interface that is wrong (checked before the generic timeout).
    Rule(
        "rendezvous_unreachable",
        "configuration",
        (
            "trying to connect to",
            "failed to connect to",
            "rendezvousconnectionerror",
            "no socket interface found",
            "name does not resolve",
            "can't resolve",
        ),
    ),
    Rule(
        "timeout",
        "timeout",
        ("timeout", "timed out", "time out", "times out", "timing out"),
        # not configuration echoes such as "timeout=0:30:00", "Timeout(ms)=600000", "timeout_s"
        _re(r"timed out|times out|timing out|time out\b|timeout(?!\s*[=(_]|s?\s*:\s*\d)"),
    ),
    # --- launchers: processes ending -----------------------------------------------------------
    Rule("msrun_kill_all", "exit", ("kill all other workers",)),
    Rule("msrun_process_exit", "exit", ("exit with exception",)),
    Rule("torchrun_child_failed", "exit", ("childfailederror",)),
    Rule(
        "torchrun_agent_failed",
        "exit",
        ("exitcode",),
        _re(r"failed \(exitcode: -?\d+\) local_rank: (?P<rank>\d+)"),
    ),
    Rule("torchrun_block", "exit", ("exitcode",), _re(r"^\s*exitcode\s*:\s*-?\d+")),
    Rule("torchrun_sigterm", "exit", ("closing signal",), _re(r"Sending process \d+ closing signal")),
    Rule(
        "srun_task_exit",
        "exit",
        ("exited with exit code",),
        _re(r"task (?P<rank>\d+): Exited with exit code"),
    ),
    Rule(
        "mpirun_signal",
        "crash",
        ("exited on signal",),
        _re(r"process rank (?P<rank>\d+) with PID \d+ on node (?P<host>\S+) exited on signal"),
    ),
    Rule("mpirun_nonzero", "exit", ("non-zero exit code", "non-zero status")),
    # --- configuration ------------------------------------------------------------------------
    Rule(
        "configuration",
        "configuration",
        (
            # devices, and ports ("Address already in use"): checked before the socket errors
            "already in use",
            "is busy",
            "device busy",
            "resource busy",
            "ncclinvalidusage",
            "invalid usage",
            "rank table",
            "ranktable",
            "rank_table",
            "ei0004",
            "ei0003",
            "ei0001",
            "duplicate gpu",
            "invalid device",
            "invalid rank",
            # HCCP cannot start on an NPU still held by an earlier process (EJ0001's
            # own reason; EJ0001 alone stays a network error)
            "last training process is running",
            # HCCL's listen socket on a port another process holds
            "been using by other process",
            # MindSpore cluster roles and node counts
            "role name",
            "could be redundant",
            # the rank-table generator cannot read the NPUs' addresses
            "hccn_tool",
            "hccn.conf",
        ),
    ),
    # --- the transport ------------------------------------------------------------------------
    Rule(
        "network",
        "network",
        (
            "connection closed",
            "connection reset",
            "connection refused",
            "connection aborted",
            "broken pipe",
            "net/ib",
            "net/socket",
            "net/plugin",
            "ibv_",
            "no route to host",
            "network is unreachable",
            "unhandled system error",
            "ncclsystemerror",
            "ncclinternalerror",
            "ncclremoteerror",
            "remote process exited",
            "network error",
            "link error",
            "link_error",
            "linkerror",
            "hccp",
            "ej0001",
            "socket",
            "distributed communication has failed",
            # CANN: HCCL could not create the link to a peer NPU
            "ei0009",
            "transport init error",
        ),
    ),
    # --- processes dying ----------------------------------------------------------------------
    Rule("launch_kernel_failed", "crash", ("launch kernel failed",)),
    # torchrun's "Signal 6 (SIGABRT) received by PID": under torch mostly the NCCL
    # watchdog aborting a process after a timeout; an exit, not a crash of its own.
    Rule("signal_abort", "exit", ("sigabrt",), _re(r"Signal 6 \(SIGABRT\) received")),
    Rule(
        "fatal_signal",
        "crash",
        (
            "segmentation fault",
            "core dumped",
            "sigsegv",
            "sigabrt",
            "sigbus",
            "sigkill",
            "killed by signal",
            "received by pid",
            "terminate called",
            "fatal python error",
            "illegal memory access",
            "device-side assert",
            "cuda error",
        ),
    ),
    Rule("shell_killed", "crash", ("killed",), _re(r"^\s*Killed\s*$", 0)),
    Rule("cann_inner_error", "crash", ("ei9999", "ee9999", "ez9999", "e19999", "e39999", "ee1001")),
    Rule("retry", "retry", ("retr",), _re(r"\bretr(?:y|ying|ied|ies)\b(?!\s*[=:]\s*\d)")),
    # --- generic library errors ------------------------------------------------------------------
    Rule(
        "comm_library_error",
        "network",
        ("hccl", "hcom", "nccl", "gloo", "distributed"),
        _re(
            r"\[ERROR\]\s*(?:HCCL|HCCP|DISTRIBUTED|GLOO)|NCCL error|nccl\w*Error|\bnccl\w+\s+failed"
            # a NCCL WARN is a failure only when it says so (others are notices)
            r"|NCCL WARN.{0,300}?(?:fail|error|timeout|timed out|abort|closed|refused|reset|unreachable)"
            r"|\b(?:hccl|hcom)\w{0,40}.{0,300}?\b(?:error|fail)|gloo.{0,300}?\berror"
        ),
    ),
    # --- the exception that ends a Python traceback ------------------------------------------------
    Rule(
        "python_stop",
        "exit",
        ("keyboardinterrupt", "systemexit"),
        _re(r"^\s*(?:KeyboardInterrupt|SystemExit)\b", 0),
    ),
    Rule(
        "python_exception",
        "crash",
        ("error", "exception"),
        _re(r"^\s*(?:[\w.]{1,200}\.)?[A-Z]\w{0,100}(?:Error|Exception)(?::|\s*$)", 0),
    ),
    Rule(
        "exit_code",
        "exit",
        ("exit",),
        _re(r"exit(?:ed)?(?: with)?(?: exit)?\s*(?:code|status)\s*[:=]?\s*-?\d+|exitcode\s*[:=]\s*-?\d+"),
    ),
    # --- what the logger itself marked, when nothing above named it --------------------------
    # a framework's error code that no rule above names: CANN's EI/EE/EJ/EZ/EH/EL codes,
    # MPI's "MPI_ABORT"; what failed is in the code's own message
    Rule(
        "framework_error_code",
        "error",
        ("ei", "ee", "ej", "ez", "eh", "el", "mpi_"),
        _re(r"\bE[EIJZHL]\d{4}\b|\bMPI_(?:ABORT|ERR_\w+)", 0),
    ),
    Rule("traceback_start", "error", ("traceback",), _re(r"Traceback \(most recent call last\)", 0)),
    # levels as loggers print them: "[ERROR]", " - ERROR - ", "ERROR:root:", "E1130 12:00:01",
    # "| ERROR |", "ERROR [file.py:10]"; a level word inside a sentence is not a level
    Rule(
        "level_error",
        "error",
        ("error", "fatal", "critical"),
        _re(r"(?:^|[\s\[|(:-])(?:ERROR|FATAL|CRITICAL)(?:$|[\s\]|):-])|^\s*[EF]\d{4} \d\d:\d\d:\d\d", 0),
    ),
    Rule(
        "level_warning",
        "warning",
        ("warn",),
        _re(r"(?:^|[\s\[|(:-])(?:WARNING|WARN|Warning)(?:$|[\s\]|):-])|\w+Warning:|^\s*W\d{4} \d\d:\d\d:\d\d", 0),
        benign=True,  # kept to say what a log holds; not a failure
    ),
)

# Ranks a process names for itself inside a message: torch's "[Rank 3]" and
# "[PG ID 0 PG GUID 0 Rank 3]" (process-group rank: global only for the default
# group), CANN's "(PID:1, Device:0, RankID:3)".
_INLINE_RANK = re.compile(
    r"\[(?:PG [^\]]{0,60}?)?Rank (\d+)\]|RankID:\s*(\d+)|\brank_?id\s*[:=]\s*(\d+)", re.IGNORECASE
)


@dataclass
class Match:
    rule: Rule
    rank: int | None = None  # the rank the line is about
    inrank: int | None = None  # a rank the line names for its writer
    host: str | None = None


# Every rule's anchors: the scan (ingest/scan.py) reports which of them an ASCII
# candidate line holds, in Rust, so that ``classify`` tries only the few rules that
# can fire instead of testing ~160 substrings in Python per line.
ANCHORS: tuple[str, ...] = tuple(sorted({a for rule in RULES for a in rule.anchors}))
_RULES_BY_ANCHORS: dict[frozenset[str], tuple[Rule, ...]] = {}


def _rules_holding(found: frozenset[str]) -> tuple[Rule, ...]:
    """The rules (in order) that have an anchor among ``found``."""
    rules = _RULES_BY_ANCHORS.get(found)
    if rules is None:
        rules = tuple(rule for rule in RULES if not found.isdisjoint(rule.anchors))
        if len(_RULES_BY_ANCHORS) < 4096:  # sets come from user text: keep the memo bounded
            _RULES_BY_ANCHORS[found] = rules
    return rules


def classify(body: str, low: str, found: Iterable[str] | None = None) -> Match | None:
    """The first rule that matches, or None. ``low`` is ``body.lower()``. ``found``,
    where given, holds every anchor that ``low`` holds (it may hold more): rules
    with none of them cannot fire and are not tried."""
    for rule in RULES if found is None else _rules_holding(frozenset(found)):
        for anchor in rule.anchors:
            if anchor in low:
                break
        else:
            continue
        if rule.regex is None:
            return Match(rule, inrank=_inline_rank(body))
        m = rule.regex.search(body)
        if m is None:
            continue
        groups = m.groupdict()
        rank = groups.get("rank")
        inrank = groups.get("inrank")
        return Match(
            rule,
            rank=int(rank) if rank else None,
            inrank=int(inrank) if inrank else _inline_rank(body),
            host=groups.get("host"),
        )
    return None


def _inline_rank(body: str) -> int | None:
    m = _INLINE_RANK.search(body)
    if not m:
        return None
    return int(next(g for g in m.groups() if g is not None))


# torchrun's failure summary: a block of "field : value" lines under
# "Root Cause (first observed failure):" whose field lines carry no keyword.
_BLOCK_FIELD = re.compile(r"^\s*(time|host|rank|exitcode|error_file|traceback)\s*:\s*(.*?)\s*$")
_BLOCK_RANK = re.compile(r"^(\d+)")


@dataclass
class BlockInfo:
    lines: list[int]
    raw: str
    rank: int | None
    host: str | None
    time_text: str | None


def read_torchrun_block(context: list[tuple[int, str]], anchor_line: int) -> BlockInfo:
    """The summary fields around an ``exitcode : N`` line (the block is contiguous)."""
    fields: dict[str, tuple[int, str]] = {}
    by_line = dict(context)
    for direction in (-1, 1):
        line = anchor_line if direction == 1 else anchor_line - 1
        while line in by_line:
            m = _BLOCK_FIELD.match(by_line[line])
            if not m:
                break
            fields.setdefault(m.group(1), (line, m.group(2)))
            line += direction
    rank_text = fields.get("rank", (0, ""))[1]
    rank_match = _BLOCK_RANK.match(rank_text)
    ordered = sorted(fields.values())
    return BlockInfo(
        lines=[line for line, _ in ordered],
        raw="; ".join(f"{name}: {value}" for name, (_, value) in sorted(fields.items(), key=lambda kv: kv[1][0])),
        rank=int(rank_match.group(1)) if rank_match else None,
        host=fields.get("host", (0, None))[1] or None,
        time_text=fields.get("time", (0, None))[1],
    )
