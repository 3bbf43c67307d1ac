"""The shape fast path: loss lines of a shape already parsed, read in bulk.

A log repeats a handful of loss-line shapes (the line with every digit run
collapsed to one "0") millions of times. The loss parser and the values reader
work out once per shape where its numbers are (LossParser's memo, values' fast
spans); what is still done per line in Python (peeling launcher prefixes, the
shape's split, the spans' positions) costs more than the rest of the ingestion.
So for a shape whose first line went through the full path, one regex made of
the shape itself (its text, each "0" a digit run, one group per number the memos
name) cuts the numbers out of all the chunk's lines of that shape at once in
polars; Python only turns the texts into the same rows.

A shape qualifies only where the full path provably gives those rows for every
line of the shape: no launcher prefix, rank tag or NCCL host can be peeled off
(checked on the shape: every prefix pattern that matches a line matches its
shape, the digit runs being only shorter there), one record per line, no event
keyword (the scan's "ev" column, per line), ASCII, no "\\r", at most PARSE_CHARS.
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from syncdoctor.doctor.ingest.fields import prefix_free
from syncdoctor.doctor.ingest.losses import LineSpec

FAST_MIN_LINES = 8  # a shape with fewer lines in a chunk is not worth a polars call


@dataclass(frozen=True)
class ShapePlan:
    """How to read a line of one shape: a regex with one group per number, the
    loss points' fields by group, the values' keys by group."""

    pattern: str  # Rust regex syntax (polars), anchored at both ends
    # per loss point: (format name, ((field, value group, "/N" total group or None), ...))
    points: tuple[tuple[str, tuple[tuple[str, int, int | None], ...]], ...]
    values: tuple[tuple[str, int], ...]  # (key, group): the first number of each key
    timed: bool  # lines of the shape carry a timestamp (the reader's memo)


def qualifies(shape: str, srun_labels: bool, host_labels: bool) -> bool:
    """Whether lines of this shape may take the fast path at all (a property of the
    shape alone; the memos it needs may still be missing)."""
    low = shape.lower()
    return (
        ("loss" in low or "step" in low)
        and low.count("loss") < 2  # one record: split_records leaves the line whole
        and "skipped=" not in low  # DeepSpeed's skip counter is read as an event
        and "\r" not in shape
        and prefix_free(shape, srun_labels, host_labels)
    )


def _escape(ch: str) -> str:
    return ch if ch.isascii() and ch.isalnum() else f"\\x{{{ord(ch):X}}}"


def build_plan(
    shape: str, specs: list[LineSpec], value_spans: list[tuple[str, int, int]], timed: bool
) -> ShapePlan | None:
    """The plan of a shape from the memos; None where two numbers' spans overlap
    without being the same (one group each could not say it)."""
    needed = {(a, b) for _, a, b in value_spans}
    for spec in specs:
        for _, span, tot in spec.fields:
            needed.add(span)
            if tot is not None:
                needed.add(tot)
    spans = sorted(needed)
    for (_, end), (start, _) in zip(spans, spans[1:], strict=False):
        if start < end:
            return None
    group = {span: i for i, span in enumerate(spans)}
    opens = {a for a, _ in spans}
    closes = {b for _, b in spans}
    out = ["^"]
    for q, ch in enumerate(shape):
        if q in closes:
            out.append(")")
        if q in opens:
            out.append("(")
        out.append("[0-9]+" if ch == "0" else _escape(ch))
    if len(shape) in closes:
        out.append(")")
    out.append("$")
    keys: dict[str, int] = {}
    for key, a, b in value_spans:
        keys.setdefault(key, group[(a, b)])
    return ShapePlan(
        pattern="".join(out),
        points=tuple(
            (
                spec.fmt,
                tuple((name, group[span], None if tot is None else group[tot]) for name, span, tot in spec.fields),
            )
            for spec in specs
        ),
        values=tuple(keys.items()),
        timed=timed,
    )


# Per shape: the lines' rows in the chunk ("i") and the texts of each group of its regex.
Numbers = dict[str, tuple[list[int], list[list[str]]]]


def fast_pool(cand: pl.DataFrame) -> pl.DataFrame:
    """The candidates that may take the fast path: a shape, no event keyword."""
    return cand.filter(pl.col("s").is_not_null() & ~pl.col("ev"))


def shape_counts(pool: pl.DataFrame) -> list[tuple[str, int]]:
    counts = pool["s"].value_counts()
    return list(zip(counts["s"].to_list(), counts["count"].to_list(), strict=True))


def cut_numbers(pool: pl.DataFrame, plans: dict[str, ShapePlan]) -> Numbers:
    """The numbers' texts of the pool's lines whose shape has a plan, one regex per shape."""
    out: Numbers = {}
    chosen = pool.filter(pl.col("s").is_in(list(plans)))
    for (shape,), group in chosen.partition_by("s", as_dict=True, maintain_order=True).items():
        numbers = (
            group.select("i", pl.col("l").str.extract_groups(plans[str(shape)].pattern).alias("n"))
            .unnest("n")
            .drop_nulls()  # cannot happen for a line of the shape; the full path if it does
        )
        if not numbers.is_empty():
            out[str(shape)] = (numbers["i"].to_list(), [numbers[c].to_list() for c in numbers.columns[1:]])
    return out
