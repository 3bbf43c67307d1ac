"""Loss (and lr, grad norm, accuracy, epoch, step) from ordinary training-log lines.

One tolerant key/value scanner covers the common shapes instead of one regex per
framework, so formats nobody listed still parse:

    step 10 loss 0.25 | step=10 loss=0.25 | Epoch [1/4] Step [10/500] Loss: 0.25
    epoch: 1 step: 10, loss is 0.25                      (MindSpore LossMonitor)
    ... loss is Tensor(shape=[], dtype=Float32, value= 0.25)
    {'loss': 0.25, 'grad_norm': 1.2, 'learning_rate': 5e-05, 'epoch': 0.5}   (HF Trainer)
    12/100 [00:01<00:08, loss=0.25]                      (tqdm, Keras: step from the counter)
    Epoch [1][50/1000]  lr: 1.0e-02, ..., loss: 0.25     (mmcv; mmengine's "Epoch(train) [1][50/1000]")
    iteration 100/500000 | lm loss: 7.6E+00 | grad norm: 2.3 |                (Megatron)
    step 3: 0.49                                         (bare "step N: value", no key)

Evaluation losses (eval_loss, val_loss, "Validation ... loss") are not training
loss and are skipped. NaN and inf are kept as such.
"""

from __future__ import annotations

import math
import re
from bisect import bisect_left
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import accumulate
from typing import Any

# A number not glued to more word characters ("0.25s", "v1.2.3" are not values);
# a sentence's full stop after it is fine.
_NUM = r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:e[-+]?\d+)?(?!\w|\.\d)|[-+]?(?:nan|inf(?:inity)?)(?![a-z])"
_KV = re.compile(
    # a key of one or two words ("loss", "grad_norm", "lm loss", "learning rate"),
    # optionally quoted (dicts, JSON) ...
    r"(?<![\w.])['\"]?(?P<key>[a-z][a-z_]*(?:[ -](?!is\b|tensor\b|array\b)[a-z][a-z_]*)?)['\"]?"
    # ... a separator: ":", "=", "is" (MindSpore) or just spaces ...
    r"\s*(?P<sep>[:=]|is\b)?\s*['\"]?"  # fairseq's JSON quotes its numbers: "loss": "7.1"
    # ... and a value, maybe wrapped: [10/500], (0.25), tensor(0.25, ...),
    # Tensor(shape=[], dtype=Float32, value= 0.25)
    r"(?P<pre>[\[(]\s*)?(?:(?:tensor|array)\((?:shape=\[[^\]]*\],\s*dtype=\w+,\s*value=)?\s*\[*\s*)?"
    r"(?P<num>" + _NUM + r")(?:\s*/\s*(?P<tot>\d+))?",
    re.IGNORECASE,
)
# "step 3: 0.49" - the playbook's bare form, no loss key at all
_STEP_COLON = re.compile(r"\bstep\s*(\d+)\s*[:：]\s*(" + _NUM + r")(?![%/])", re.IGNORECASE)
# progress counters of tqdm and Keras: "12/100 [00:01<...", " 100/1875 [=====>..."
_COUNTER = re.compile(r"(?<![\d./])(\d+)/(\d+)\s*\[")
# MMEngine (mmdetection, mmpretrain ...): "Epoch(train)  [1][ 50/500]", "Iter(train) [  50/1000]"
# ... and mmcv / DETR-style loggers: "Epoch [1][50/1000]", "Epoch: [0]  [  50/7393]"
_MM_EPOCH = re.compile(r"\bEpoch(?P<engine>\(train\))?:?\s*\[\s*(\d+)\s*\]\s*\[\s*(\d+)\s*/\s*(\d+)\s*\]")
_MM_ITER = re.compile(r"\bIter\(train\)\s*\[\s*(\d+)\s*/\s*(\d+)\s*\]")
_LIST_TAIL = re.compile(r"\s*,\s*[-+]?[\d.]")
_EVAL_WORD = re.compile(
    r"\b(?:eval|evaluation|evaluating|validation|validating|valid|val|test|testing)\b",
    re.IGNORECASE,
)

# Field names, lower case with "_" for space or "-".
_FIELDS: dict[str, str] = {}
for _field, _names in {
    "step": (
        "step",
        "steps",
        "global_step",
        "globalstep",
        "iter",
        "iters",
        "iteration",
        "iterations",
        "batch",
        "train_step",
        "cur_step",
        "step_num",
        "num_step",
        "update",
        "updates",
        "num_updates",
    ),
    "epoch": ("epoch", "epochs", "ep", "cur_epoch", "epoch_num"),
    "loss": (
        "loss",
        "train_loss",
        "training_loss",
        "total_loss",
        "lm_loss",
        "tr_loss",
        "loss_value",
        "loss_total",
        "step_loss",
        "batch_loss",
        "running_loss",
        "avg_loss",
        "mean_loss",
        "overall_loss",
    ),
    "lr": ("lr", "learning_rate", "learningrate", "cur_lr", "current_lr", "base_lr"),
    "grad_norm": (
        "grad_norm",
        "gnorm",
        "gradnorm",
        "gradient_norm",
        "grad_l2_norm",
        "total_norm",
        "global_norm",
        "global_grad_norm",
        "grad_l2",
    ),
    "acc": ("acc", "accuracy", "train_acc", "train_accuracy", "training_accuracy", "top1"),
    "rank": ("rank", "global_rank", "rank_id", "rankid"),
}.items():
    for _name in _names:
        _FIELDS[_name] = _field
# "train loss", "global step": a qualifier word then a field word.
_QUALIFIERS = {
    "train",
    "training",
    "global",
    "total",
    "cur",
    "current",
    "overall",
    "the",
    "at",
    "lm",
    "avg",
    "mean",
    "running",
}
_EVAL_PREFIXES = {"eval", "evaluation", "val", "valid", "validation", "test", "testing", "dev"}
_EVAL = "eval"


def _canonical(key: str, cache: dict[str, str | None] = {}) -> str | None:  # noqa: B006 - memo
    hit = cache.get(key, "")
    if hit != "":
        return hit
    k = key.lower().replace("-", "_").replace(" ", "_")
    field: str | None = _FIELDS.get(k)
    if field is None:
        parts = k.split("_")
        if parts[0] in _EVAL_PREFIXES and len(parts) > 1:
            field = _EVAL
        elif len(parts) == 2 and parts[0] in _QUALIFIERS:
            field = _FIELDS.get(parts[1])
    if len(cache) < 10_000:  # keys come from user text: keep the memo bounded
        cache[key] = field
    return field


def _to_float(text: str) -> float:
    try:
        return float(text)
    except ValueError:  # "Infinity" variants float() does not know
        low = text.lower()
        return -math.inf if low.startswith("-") and "inf" in low else (math.inf if "inf" in low else math.nan)


@dataclass
class LossPoint:
    loss: float
    step: int | None = None
    step_total: int | None = None  # "Step [10/500]": steps per epoch, when printed
    epoch: float | None = None
    lr: float | None = None
    grad_norm: float | None = None
    acc: float | None = None
    rank: int | None = None  # a rank field inside the line ("rank=3", "| rank 0 |")
    fmt: str = ""


Span = tuple[int, int]


@dataclass(frozen=True)
class LineSpec:
    """Where the numbers of one loss point sit in a line."""

    fmt: str
    fields: tuple[tuple[str, Span, Span | None], ...]  # (field, value span, "/N" span)


def _structure(body: str) -> list[LineSpec]:
    """Which loss points a line holds and where their numbers are."""
    found: dict[str, tuple[Span, Span | None]] = {}
    loss_match: re.Match[str] | None = None
    loss_exact = False
    saw_eval = False
    eval_at: int | None = None  # where the first evaluation key starts
    for m in _KV.finditer(body):
        field = _canonical(m.group("key"))
        if field is None:
            continue
        if field == _EVAL:
            saw_eval = True
            eval_at = m.start() if eval_at is None else eval_at
            continue
        if m.group("pre") and _LIST_TAIL.match(body, m.end()):
            continue  # a list of values (per-parameter norms), not one number
        if field == "loss":
            exact = m.group("key").lower() == "loss"
            if loss_match is not None and (loss_exact or not exact):
                continue
            loss_match, loss_exact = m, exact
        elif field in found:
            continue  # the first occurrence wins ("lr 0.1 ... (lr warmup 0.2)")
        found[field] = (m.span("num"), m.span("tot") if m.group("tot") else None)
    if loss_match is None:
        if saw_eval:
            return []
        return [
            LineSpec("step_colon", (("step", m.span(1), None), ("loss", m.span(2), None)))
            for m in _STEP_COLON.finditer(body)
        ]
    if _EVAL_WORD.search(body, 0, loss_match.start()):
        # "Validation: epoch 1 loss 0.31", Megatron's "validation loss at iteration
        # 7000 | lm loss value: 7.17": an evaluation line
        return []
    if eval_at is not None and eval_at < loss_match.start():
        return []  # an evaluation key ("val_acc: 0.9, loss: ...") before the loss
    if "train_runtime" in body:
        return []  # HF's end-of-training summary: train_loss is the run average
    fields: list[tuple[str, Span, Span | None]] = [("loss", *found["loss"])]
    fmt = _format_name(body, loss_match)
    if "step" in found:
        fields.append(("step", *found["step"]))
    elif mm := _MM_EPOCH.search(body):
        fmt = "mmengine" if mm.group("engine") else "mmcv"
        fields.append(("step", mm.span(3), mm.span(4)))
        found.setdefault("epoch", (mm.span(2), None))
    elif mm := _MM_ITER.search(body):
        fmt = "mmengine"
        fields.append(("step", mm.span(1), None))  # the total is the run's, not an epoch's
    elif counter := _COUNTER.search(body):
        fields.append(("step", counter.span(1), counter.span(2)))
    fields.extend((name, *found[name]) for name in ("epoch", "lr", "grad_norm", "acc", "rank") if name in found)
    return [LineSpec(fmt, tuple(fields))]


def _fill(spec: LineSpec, text: str, pos: Callable[[int], int] | None = None) -> LossPoint:
    """Read a spec's numbers out of ``text``; ``pos`` maps spec positions to text positions."""
    fields: list[tuple[str, str, str | None]] = []
    for name, (a, b), tot in spec.fields:
        if pos is not None:
            a, b = pos(a), pos(b)
        total = None
        if tot is not None:
            ta, tb = (pos(tot[0]), pos(tot[1])) if pos is not None else tot
            total = text[ta:tb]
        fields.append((name, text[a:b], total))
    return point_from_texts(spec.fmt, fields)


def point_from_texts(fmt: str, fields: Sequence[tuple[str, str, str | None]]) -> LossPoint:
    """A loss point from the texts of its numbers: (field, value, the "/N" total or None).
    The shape fast path (ingest/core.py) cuts the same texts out with one regex per shape."""
    point = LossPoint(loss=math.nan, fmt=fmt)
    for name, text, total in fields:
        value = _to_float(text)
        if name == "loss":
            point.loss = value
        elif name == "step":
            point.step = _to_int(value)
            if total is not None:
                point.step_total = _to_total(total)
        elif name == "epoch":
            point.epoch = value if math.isfinite(value) else None
        elif name == "rank":
            point.rank = _to_int(value)
        else:
            setattr(point, name, value)
    return point


def floats(texts: Sequence[str]) -> list[float]:
    """``_to_float`` of many texts: float() over the list in one go, per text only
    where one of them is not a number float() knows."""
    try:
        return list(map(float, texts))
    except ValueError:
        return [_to_float(text) for text in texts]


def point_columns(fields: Sequence[tuple[str, Sequence[str], Sequence[str] | None]], n: int) -> dict[str, list[Any]]:
    """What ``point_from_texts`` gives for each of ``n`` lines of one spec, as columns
    (LossPoint's field -> one value per line): the fields' texts come as columns too,
    (field, the values' texts, the "/N" totals' texts or None). The shape fast path
    reads a chunk's lines of a shape with this, at once."""
    out: dict[str, list[Any]] = {"loss": [math.nan] * n}
    for name, texts, totals in fields:
        values = floats(texts)
        if name == "loss":
            out["loss"] = values
        elif name == "step":
            out["step"] = [_to_int(v) for v in values]
            if totals is not None:
                out["step_total"] = [_to_total(t) for t in totals]
        elif name == "epoch":
            out["epoch"] = [v if math.isfinite(v) else None for v in values]
        elif name == "rank":
            out["rank"] = [_to_int(v) for v in values]
        else:
            out[name] = values
    return out


def parse_loss_line(body: str) -> list[LossPoint]:
    """Training-loss points in one line (usually zero or one)."""
    return [_fill(spec, body) for spec in _structure(body)]


_DIGITS = re.compile(r"\d+")
_DIGIT_RUNS = re.compile(r"(\d+)")


class LossParser:
    """``parse_loss_line`` with a memo of line shapes.

    A log repeats a handful of line shapes millions of times, differing only in
    their digits. The shape (every digit run collapsed to one "0") decides what
    the scanner finds, because no pattern here depends on how many digits a run
    has; so the spans found in the shape, shifted by each run's real length,
    locate the numbers of every line of that shape. Re-reading them is several
    times cheaper than scanning the line again.
    """

    MAX_SHAPES = 2048

    def __init__(self) -> None:
        self._shapes: dict[str, tuple[list[LineSpec], list[int]]] = {}
        self.last_shape = ""  # the shape of the last line parsed (callers memo by it too)
        # shape position -> position in the last line that held a loss point
        self.last_pos: Callable[[int], int] | None = None

    def parse(self, body: str) -> list[LossPoint]:
        # one pass: the text between digit runs, and the runs (split keeps the group)
        parts = _DIGIT_RUNS.split(body)
        shape = self.last_shape = "0".join(parts[0::2])
        known = self._shapes.get(shape)
        if known is None:
            known = (_structure(shape), [m.start() for m in _DIGITS.finditer(shape)])
            if len(self._shapes) < self.MAX_SHAPES:
                self._shapes[shape] = known
        specs, runs = known
        if not specs:
            return []
        # text position of shape position q: q plus the extra length of the runs before it
        extra = list(accumulate((len(r) - 1 for r in parts[1::2]), initial=0))

        def pos(q: int) -> int:
            return q + extra[bisect_left(runs, q)]

        self.last_pos = pos
        return [_fill(spec, body, pos) for spec in specs]

    def known(self, shape: str) -> list[LineSpec] | None:
        """The loss points a line of this shape holds, where a line of it was parsed
        and memoised; None where none was."""
        known = self._shapes.get(shape)
        return None if known is None else known[0]


def _to_int(value: float) -> int | None:
    return int(value) if math.isfinite(value) and abs(value) < 2**62 else None


def _to_total(digits: str) -> int | None:
    # Longer would not fit the Int64 column (and int() refuses over 4,300 digits).
    return int(digits) if len(digits) < 19 else None


def _format_name(body: str, loss: re.Match[str]) -> str:
    """A short name for the shape of a loss line (reported per file)."""
    head = body.lstrip()
    if head.startswith("{'"):
        return "hf_trainer"
    if head.startswith('{"'):
        return "json"
    sep = (loss.group("sep") or "").lower()
    if sep == "is":
        return "mindspore_lossmonitor"
    if _COUNTER.search(body):
        return "progress_bar"
    if body.count("|") >= 2:
        return "megatron" if "iteration" in body else "pipe_fields"
    if re.search(r"(?:epoch|step|iter\w*|batch)\s*\[", body, re.IGNORECASE):
        return "bracketed"
    if sep == "=":
        return "key=value"
    if sep == ":":
        return "key: value"
    return "key value"


@dataclass
class StepResult:
    steps: list[int]
    warning: str | None = None


def global_steps(
    raw_steps: list[int | None],
    totals: list[int | None],
    epochs: list[float | None],
    lines: list[int],
) -> StepResult:
    """Turn one rank's printed steps (file order) into a monotonically increasing
    global step.

    * No step printed (HF Trainer dicts): order of appearance, 1, 2, 3, ...
    * A per-epoch counter (MindSpore LossMonitor prints the step within the epoch;
      "Epoch [e] Step [i/N]"): when the counter goes back and the epoch advanced,
      or the steps per epoch were printed, or it went back to the start, later
      epochs are shifted by the steps per epoch (N when printed, else the largest
      counter seen, which is exact when the last step of an epoch is printed).
    * The counter going back to a mid value within the same epoch is a resumed
      run: those steps are kept as printed and a warning says so.
    """
    out: list[int] = []
    warning: str | None = None
    offset = 0
    prev_raw: int | None = None
    prev_epoch: float | None = None
    first_raw: int | None = None
    zero_based = False
    per_epoch = 0  # steps per epoch, estimated
    seg_max: int | None = None
    for raw, tot, epoch, line in zip(raw_steps, totals, epochs, lines, strict=True):
        if raw is None:
            out.append((out[-1] if out else 0) + 1)
            continue
        if first_raw is None:
            first_raw = raw
        zero_based = zero_based or raw == 0
        if prev_raw is not None and seg_max is not None and raw < prev_raw:
            epoch_advanced = epoch is not None and prev_epoch is not None and epoch > prev_epoch
            if epoch_advanced or tot or raw <= max(first_raw, 1):
                per_epoch = max(per_epoch, tot or 0, seg_max - (0 if zero_based else 1) + 1)
                skipped = 1
                if epoch_advanced and float(epoch).is_integer() and float(prev_epoch).is_integer():  # type: ignore[arg-type]
                    skipped = max(1, int(epoch - prev_epoch))  # type: ignore[operator]
                offset += per_epoch * skipped
            elif warning is None:
                warning = (
                    f"step counter went back from {prev_raw} to {raw} at line {line} "
                    "within one epoch (a resumed run?); those steps are kept as printed"
                )
            seg_max = raw
        seg_max = raw if seg_max is None else max(seg_max, raw)
        prev_raw, prev_epoch = raw, (epoch if epoch is not None else prev_epoch)
        out.append(raw + offset)
    return StepResult(out, warning)


# Lines of several ranks glued together (unflushed stdout of processes sharing one
# terminal): "rank 1 step 50 loss 5.9896rank 0 step 50 loss 0.6566", or a launcher
# tag in mid-line: "step 50 loss 5.98[rank0]: step 50 loss 0.65".
_RECORD_HEAD = re.compile(r"\s*([A-Za-z_]{2,20})\b")
_MIDLINE_TAG = re.compile(r"\[(?:rank|default|worker)\d+\]:\s?|\[\d+,\d+\]<std(?:out|err)>:\s?")


def split_records(body: str) -> list[str]:
    """The records a line holds: one, or several when a record's first word (or a
    launcher tag) reappears later in a line that carries the loss key twice."""
    low = body.lower()
    if low.count("loss") < 2:
        return [body]
    head = _RECORD_HEAD.match(body)
    if head is None:
        return [body]
    word = head.group(1)
    tags = {m.end(): m.start() for m in _MIDLINE_TAG.finditer(body, head.end())}
    cuts = set(tags.values())
    for m in re.finditer(re.escape(word) + r"\b", body[head.end() :]):
        at = head.end() + m.start()
        # the word must start a record: glued to a number, or after a tag
        if at in tags:
            continue  # already cut at the tag before it
        if body[at - 1].isdigit() or body[at - 1] in ".%)]":
            cuts.add(at)
    if not cuts:
        return [body]
    bounds = [0, *sorted(cuts), len(body)]
    parts = [body[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]
    return [p for p in parts if p.strip()]
