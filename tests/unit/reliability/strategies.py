"""Hypothesis strategies for hostile inputs: log lines, probe records, rank tables.

Inputs are built from the shapes the parsers expect (so they get past the first
check and reach the deep code) and then mangled: absurd numbers, wrong types,
truncated lines, binary junk, control characters.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

from hypothesis import strategies as st

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
RANK_TABLES = Path(__file__).resolve().parents[2] / "rules" / "_shared" / "rank_tables"

# Numbers as a log prints them, including the ones that break naive parsing.
ABSURD_NUMBERS = (
    "1e308", "-1e308", "1e309", "1e-400", "nan", "NaN", "-nan", "inf", "-inf", "Infinity",
    "-0.0", "0", "-0", "00000000000000000000007", "9" * 400, "-" + "9" * 40, "1.", ".5",
    "1e", "0x1p3", "1_000", "٣", "１２", "2.5e+10", "4.9e-324", "1.7976931348623157e308",
)  # fmt: skip
CONTROL = ("\x00", "\x07", "\x08", "\x1b[2J", "\x1b]0;title\x07", "\x1b[31m", "\r", "\x7f",
           "\x9b", "\u202e", "\ufeff", "\ud7ff", "\t", "\x0c")  # fmt: skip
LINE_TEMPLATES = (
    "step {a} loss {b}",
    "step={a} loss={b} lr={c} grad_norm={d}",
    "Epoch [{a}/{c}] Step [{b}] Loss: {d}",
    "Iter {a}/{c}, loss: {b}, acc: {d}",
    "[rank{a}] epoch {c} step {b}/{d} loss {b}",
    "epoch: {a} step: {b}, loss is {c}",
    "{{'loss': {a}, 'learning_rate': {b}, 'epoch': {c}}}",
    "[1,{a}]<stdout>: step {b} loss {c}",
    "{a}: step {b} loss {c}",
    "node{a}:123:456 [{b}] NCCL INFO comm 0x1 rank {a} nranks {c} cudaDev 0 - Init COMPLETE",
    "[E ProcessGroupNCCL.cpp:{a}] [Rank {b}] Watchdog caught collective operation timeout: "
    "WorkNCCL(SeqNum={c}, OpType=ALLREDUCE) ran for {d} milliseconds before timing out.",
    "[ERROR] HCCL({a},python):2026-11-29-10:00:{b} hcom_allreduce retry {c} timeout",
    "torch.distributed.elastic.multiprocessing.errors.ChildFailedError:",
    "  rank      : {a} (local_rank: {b})",
    "  exitcode  : {c} (pid: {d})",
    "RuntimeError: CUDA out of memory. Tried to allocate {a} GiB on rank {b}",
    "[WARNING] Loss shows abnormal fluctuation: from {a} to {b} within {c} steps",
    "[ERROR] GRADIENT_SYNC: Rank {a} and Rank {b} parameter gradient mismatch at step {c}",
    "2026-11-29 10:00:{a},{b} INFO step {c} loss {d}",
    "Traceback (most recent call last):",
    "Segmentation fault (core dumped) signal {a}",
    "{a}%|####| {b}/{c} [00:01<00:02, loss={d}]\r{a}%|####| {b}/{c} [00:02<00:01, loss={a}]",
)


def _fixture_lines() -> list[str]:
    lines: list[str] = []
    for path in sorted((FIXTURES / "logs").rglob("*")):
        if path.is_file():
            lines += path.read_text(encoding="utf-8", errors="replace").splitlines()[:40]
    return [line for line in lines if line.strip()]


FIXTURE_LINES = tuple(_fixture_lines())

numbers = st.one_of(
    st.sampled_from(ABSURD_NUMBERS),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.integers(min_value=-(2**80), max_value=2**80).map(str),
)
noise = st.text(st.characters(codec="utf-8", exclude_characters="\n"), max_size=30)


@st.composite
def log_lines(draw: st.DrawFn) -> str:
    """A line the parsers care about, with absurd numbers and control characters in it."""
    kind = draw(st.sampled_from(("template", "fixture", "noise")))
    if kind == "template":
        template = draw(st.sampled_from(LINE_TEMPLATES))
        line = template.format(a=draw(numbers), b=draw(numbers), c=draw(numbers), d=draw(numbers))
    elif kind == "fixture":
        line = draw(st.sampled_from(FIXTURE_LINES))
    else:
        line = draw(noise)
    for _ in range(draw(st.integers(0, 2))):  # splice in control sequences or junk
        at = draw(st.integers(0, len(line)))
        bit = draw(st.sampled_from(CONTROL) | noise)
        line = line[:at] + bit + line[at:]
    return line


@st.composite
def log_file(draw: st.DrawFn) -> bytes:
    lines = draw(st.lists(log_lines(), max_size=40))
    ending = draw(st.sampled_from(("\n", "\r\n", "\r")))
    blob = ending.join(lines).encode("utf-8", errors="surrogatepass")
    if draw(st.booleans()):
        blob += ending.encode()
    if draw(st.integers(0, 9)) == 0:  # truncated mid-line, or binary junk appended
        blob = blob[: draw(st.integers(0, len(blob)))] + draw(st.binary(max_size=200))
    return blob


LOG_NAMES = ("train.log0", "train.log1", "rank3.log", "worker_2.log", "stdout",
             "node1/rank7.log", "attempt_0/1/stdout.log", "x.txt", "rank99999.log",
             "trainer_state.json", "run.log.gz")  # fmt: skip


@st.composite
def log_folders(draw: st.DrawFn) -> dict[str, bytes]:
    names = draw(st.lists(st.sampled_from(LOG_NAMES), min_size=1, max_size=4, unique=True))
    files = {}
    for name in names:
        blob = draw(log_file())
        if name.endswith(".gz"):
            import gzip

            blob = gzip.compress(blob)
            if draw(st.booleans()):
                blob = blob[: len(blob) // 2]
        elif name == "trainer_state.json":
            blob = json.dumps({"log_history": draw(st.lists(JSON_VALUES, max_size=5))}).encode()
        files[name] = blob
    return files


# ----------------------------------------------------------------------------- records

JSON_LEAVES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from((2**63 - 1, -(2**63), 2**64, 10**30, 0, -1)),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
)
# Any JSON value, weighted to the ones that break type assumptions; shallow, because
# the parsers only ever look one or two levels down.
JSON_VALUES = st.recursive(
    JSON_LEAVES,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=6,
)


def _mangled(draw: st.DrawFn, fields: dict[str, Any]) -> dict[str, Any]:
    """A valid record with up to three fields retyped or left out."""
    keys = [k for k in fields if k not in ("v", "kind")]
    for key in draw(st.lists(st.sampled_from(keys), max_size=3, unique=True)):
        if draw(st.booleans()):
            del fields[key]
        else:
            fields[key] = draw(JSON_VALUES)
    return fields


@st.composite
def records(draw: st.DrawFn, rank: int, world: int) -> dict[str, Any]:
    kind = draw(st.sampled_from(("snapshot", "step", "step", "step", "check", "event", "end", "other")))
    step = draw(st.integers(0, 30))
    fp = draw(st.sampled_from((0, 1, -(2**63), 2**63 - 1)))
    base: dict[str, Any] = {"v": draw(st.sampled_from((1, 1, 1, 1, 1, 1, 1, 1, 2, "1"))), "kind": kind, "rank": rank}
    if kind == "snapshot":
        fields = {
            **base,
            "world_size": draw(st.sampled_from((world, 2**40, 2**62, 0, -3))),
            "local_rank": rank,
            "framework": "torch",
            "t": 1.0e9,
            "env": {"RANK": str(rank)},
            "loss": {"type": "CrossEntropyLoss", "params": {}},
            "loader": {"dataset_len": draw(JSON_LEAVES), "batch_size": 8},
            "optimizer": {"type": "SGD", "param_groups": [{"lr": 0.1}], "n_params": 3},
            "init_param_fp": fp,
            "check_every": 10,
            "tensors": ["w", "b"],
            "seed": {},
        }
    elif kind == "step":
        fields = {
            **base,
            "step": step,
            "micro": 1,
            "backward": step,
            "t": 1.0e9 + step,
            "loss": draw(st.floats(allow_nan=True, allow_infinity=True) | st.none()),
            "lr": 0.1,
            "grad_norm": draw(st.floats(allow_nan=True, allow_infinity=True)),
            "grad_norm_local": 1.0,
            "reduce_ratio": 0.7,
            "param_fp": fp,
            "opt_fp": fp,
            "grad_fp": fp,
            "data_fp": fp,
            "samples": 8,
            "overflow": False,
            "opt_steps": step,
            "train_mode": "1/1",
            "ids": [rank, step],
        }
    elif kind == "check":
        fields = {
            **base,
            "step": step,
            "status": draw(st.sampled_from(("ok", "mismatch", "incomplete"))),
            "what": ["param"],
            "ranks": [rank],
            "tensor": "w",
            "detail": {"follow_up": draw(st.booleans())},
        }
    elif kind == "event":
        fields = {
            **base,
            "t": 1.0e9,
            "step": step,
            "message": draw(st.text(max_size=20)),
            "event": draw(st.sampled_from(("timeout", "crash", "oom", "retry", "x"))),
        }
    elif kind == "end":
        fields = {**base, "step": step, "t": 1.0e9, "status": "ok", "message": ""}
    else:
        fields = {**base, "kind": draw(st.text(max_size=8))}
    return _mangled(draw, fields)


def encode(draw: st.DrawFn, record: dict[str, Any]) -> bytes:
    """The writer's compact encoding, sometimes mangled the ways files get damaged."""
    line = json.dumps(record, separators=(",", ":"), allow_nan=True).encode()
    roll = draw(st.integers(0, 19))
    if roll == 0:
        return line[: draw(st.integers(0, len(line)))]  # torn write
    if roll == 1:
        return draw(st.binary(max_size=60))
    if roll == 2:  # bytes flipped inside the line
        at = draw(st.integers(0, len(line)))
        return line[:at] + draw(st.binary(min_size=1, max_size=4)) + line[at + 1 :]
    if roll == 3:
        return json.dumps(draw(JSON_VALUES)).encode()  # valid JSON, not an object
    return line


@st.composite
def record_folders(draw: st.DrawFn) -> dict[str, bytes]:
    world = draw(st.integers(1, 4))
    ranks = draw(st.lists(st.integers(0, world), min_size=1, max_size=world + 1, unique=True))
    files = {}
    for rank in ranks:
        lines = [encode(draw, draw(records(rank, world))) for _ in range(draw(st.integers(0, 12)))]
        blob = b"\n".join(lines) + (b"\n" if draw(st.integers(0, 4)) else b"")
        files[f"rank{rank}.jsonl"] = blob
    if draw(st.integers(0, 9)) == 0:  # a name the reader must cope with
        files[
            draw(st.sampled_from(("rank007.jsonl", "rank99999999999999999999.jsonl", "rank-1.jsonl", "rank.jsonl")))
        ] = b'{"v":1,"kind":"end"}\n'
    if draw(st.integers(0, 2)) == 0:  # a killed rank's every-step tail (records/tail.py), damaged or not
        rank = draw(st.sampled_from(ranks))
        files[f"rank{rank}.{draw(st.integers(1, 99))}.0.tail"] = draw(tail_files(rank))
    return files


_INT64 = st.integers(-(2**63), 2**63 - 1)


@st.composite
def tail_files(draw: st.DrawFn, rank: int) -> bytes:
    """A memory-mapped step tail: a plausible header and entries, hostile numbers, cuts."""
    header_rank = draw(st.sampled_from((rank, rank + 1, -1)))
    slots = draw(st.sampled_from((4, 256, 0, -5, 2**62)))
    flushed = draw(st.sampled_from((0, 3, -1, 2**62)))
    blob = struct.pack("<8sqqq", draw(st.sampled_from((b"SDTAIL1\n", b"SDTAIL9\n"))), header_rank, slots, flushed)
    for i in range(draw(st.integers(0, 6))):
        seq = flushed + i + 1 if draw(st.integers(0, 4)) else draw(_INT64)
        blob += struct.pack(
            "<qqqqqdddq",
            seq,
            *draw(st.tuples(_INT64, _INT64, _INT64, _INT64)),
            *draw(st.tuples(st.floats(), st.floats(), st.floats())),
            draw(_INT64),
        )
    if draw(st.integers(0, 3)) == 0:
        blob = blob[: draw(st.integers(0, len(blob)))]  # cut anywhere
    return blob


# ----------------------------------------------------------------------------- rank tables


def _good_tables() -> list[Any]:
    return [json.loads(p.read_text()) for p in sorted(RANK_TABLES.glob("good*.json"))]


GOOD_TABLES = tuple(_good_tables())


def _mangle_json(draw: st.DrawFn, value: Any, depth: int = 0) -> Any:
    """Replace, drop or retype parts of a valid table, deep inside as well as on top."""
    roll = draw(st.integers(0, 9))
    if roll == 0:
        return draw(JSON_VALUES)
    if isinstance(value, dict):
        out = {}
        for key, item in value.items():
            if draw(st.integers(0, 11)) == 0:
                continue
            out[key] = _mangle_json(draw, item, depth + 1)
        return out
    if isinstance(value, list):
        items = [_mangle_json(draw, item, depth + 1) for item in value]
        if items and draw(st.integers(0, 5)) == 0:
            items.append(items[0])  # a duplicate entry
        return items
    return value


@st.composite
def rank_table_texts(draw: st.DrawFn) -> bytes:
    table = _mangle_json(draw, draw(st.sampled_from(GOOD_TABLES)))
    text = json.dumps(table, indent=draw(st.sampled_from((None, 1, 4))), allow_nan=True)
    roll = draw(st.integers(0, 9))
    if roll == 0:
        text = text[: draw(st.integers(0, len(text)))]
    elif roll == 1:
        at = draw(st.integers(0, len(text)))
        text = text[:at] + draw(st.sampled_from(CONTROL) | noise) + text[at:]
    return text.encode("utf-8", errors="surrogatepass")
