"""Every key -> number pair a log line prints, whatever the format.

No table of formats: the pairs come from the shapes people print numbers in,

    key=value   key: value   key value   key is value   "key": value (JSON)
    'key': value (Python dicts)   key:[ i/ n]   [i/n]   i / n   12.5ms   45%

A number's key is the word (or, after ":" / "=" / "is", up to three words) right
before it; a number with no word before it that opens an ``i/n`` counter is the
line's ``counter``; other bare numbers are left out (they are parts of paths, ids,
dates). Timestamps are blanked first, so "10:12:01" is not three pairs. Units and
percent signs are dropped from the value (the key keeps its meaning).

Keys are normalised (lower case, "_" for spaces and dashes, a trailing "(train)"
dropped), so "Learning Rate", "learning-rate" and "learning_rate" are one key.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable

# Dates, clock times and elapsed times ("2026-11-29", "10:12:01.123", "00:01<00:08")
_TIMES = re.compile(r"\d{4}[-/]\d\d[-/]\d\d(?:[ T_-]\d\d:\d\d(?::\d\d)?(?:[.,]\d+)*)?|\d+:\d\d(?::\d\d)?(?:[.,]\d+)*")
# A number not glued to a word before it ("log0", "v1.2"), with an optional unit
# glued after it ("0.25s", "12ms", "3.2GB", "45%", "14.5it/s").
_NUMBER = re.compile(
    r"(?<![\w.])(?P<num>[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?|[-+]?(?:nan|inf(?:inity)?))"
    r"(?P<unit>%|[a-zA-Z]{1,3}(?:/s)?)?(?![\w.])",
    re.IGNORECASE,
)
_TOTAL = re.compile(r"\s*/\s*(\d+)")
# What may sit between a key and its number.
_GAP = " \t:=\"'[(<"
_WORD = re.compile(r"([A-Za-z_][\w.\-]{0,40}?)(\([A-Za-z]\w{0,20}\))?$")
_STOP = {"is", "was", "are", "to", "of", "at", "from", "by", "now", "be"}
# glog headers ("I1130" then the pid), source locations ("train.py:52"): not keys
_NOT_A_KEY = re.compile(r"^\d|^[a-z]?\d+$|_(?:py|cc|cpp|cu|h|c|rs|go|java)$")
MAX_PAIRS = 64  # per line: a dump of a tensor is not a record of values


def _normal(key: str) -> str:
    return key.lower().replace("-", "_").replace(".", "_").replace(" ", "_").strip("_")


def _key_before(text: str, end: int) -> tuple[str | None, bool]:
    """The key of a number starting at ``end``: (key, it had a separator)."""
    i = end
    while i > 0 and text[i - 1] in _GAP:
        i -= 1
    gap = text[i:end]
    separated = ":" in gap or "=" in gap
    # "lm loss: 7.6", "grad scale is small: 1e-26": a key of several words before ":"
    # or "is"; "key=value" keys are one token ("SGD momentum=0.9" is momentum)
    phrase = ":" in gap
    head = text[max(0, i - 120) : i]
    if head.endswith(" is") or head.endswith(" Is"):
        head = head[:-3].rstrip()
        separated = phrase = True
    m = _WORD.search(head)
    if m is None:
        return None, separated
    if m.group(1).lower() in _STOP and head[: m.start()].endswith(" "):
        # "loss scale dropped to 0.5", "scale fell from 8": the key is before the preposition
        head = head[: m.start()].rstrip()
        separated = phrase = True
        m = _WORD.search(head)
        if m is None:
            return None, separated
    words = [m.group(1)]
    if phrase:
        # "Grad scale is small: 1e-26", "lm loss: 7.6": up to three words before a
        # separator, stopping at any punctuation
        rest = head[: m.start()]
        while len(words) < 3:
            if not rest.endswith(" ") or rest.endswith("  "):
                break
            w = re.search(r"([A-Za-z_][\w\-]{0,30})$", rest[:-1])
            if w is None:
                break
            if w.group(1).lower() not in _STOP:
                words.insert(0, w.group(1))
            rest = rest[: w.start()]
    key = _normal(" ".join(words))
    if not key or _NOT_A_KEY.search(key):
        return None, separated
    return key, separated


_DIGITS = re.compile(r"\d+")
_Role = tuple[str, bool] | None  # (key, is the total of a counter) or None: not a value
_PLANS: dict[str, list[_Role]] = {}
MAX_PLANS = 4096


def _plan(text: str, matches: list[re.Match[str]]) -> list[_Role]:
    """What each number of a line is: its key, the total of a counter, or nothing."""
    roles: list[_Role] = [None] * len(matches)
    by_start = {m.start(): i for i, m in enumerate(matches)}
    skip_until = -1
    keys = 0
    for i, m in enumerate(matches):
        if keys >= MAX_PAIRS:
            break
        start = m.start()
        if start < skip_until:
            continue  # the total of a counter, already taken
        before = text[start - 1] if start else ""
        if before == "/" or (before in "-_" and start > 1 and text[start - 2].isalnum()):
            continue  # a path or name part ("exp/2500/model-2.pt") or a rate's denominator
        total = _TOTAL.match(text, m.end())
        key, _ = _key_before(text, start)
        if key is None:
            if total is None:
                continue
            key = "counter"
        roles[i] = (key, False)
        keys += 1
        if total is not None:
            skip_until = total.end(1)
            j = by_start.get(total.start(1))
            if j is not None and "." not in m.group("num") and "e" not in m.group("num").lower():
                roles[j] = (key + "_total", True)
    return roles


# shape -> (key, start, end) of each value's digits in the shape: a line of a known
# shape whose digit runs the loss parser has located is read without a regex.
_FAST: dict[str, list[tuple[str, int, int]]] = {}


def line_values(body: str, shape: str | None = None, pos: Callable[[int], int] | None = None) -> dict[str, float]:
    """The key -> number pairs of one line (the first value of a key wins).

    ``i/n`` counters give ``key`` = i and ``key_total`` = n; a counter with no key
    is ``counter``. A log repeats a few line shapes, differing in their digits: what
    each number is, is worked out once per shape (``shape``: the line with every
    digit run collapsed to "0", as the loss parser computes it), as the loss parser
    does; timestamps are blanked only then. ``pos`` maps a position in the shape to
    one in ``body`` (the loss parser's, for the line it just parsed): then a known
    shape's values are cut out of the line where the shape's numbers are."""
    if pos is not None and shape is not None:
        fast = _FAST.get(shape)
        if fast is not None:
            found: dict[str, float] = {}
            for key, a, b in fast:
                try:
                    number = float(body[pos(a) : pos(b)])
                except ValueError:
                    number = math.nan
                found.setdefault(key, number)
            return found
    matches = list(_NUMBER.finditer(body))
    if not matches:
        return {}
    if shape is None:
        shape = _DIGITS.sub("0", body)
    roles = _PLANS.get(shape)
    if roles is None or len(roles) != len(matches):
        roles = _plan_raw(body, matches)
        if len(_PLANS) < MAX_PLANS:
            _PLANS[shape] = roles
    if pos is not None and shape not in _FAST and len(_FAST) < MAX_PLANS:
        # the numbers of the shape are those of the line, digit runs collapsed: no
        # part of _NUMBER depends on how many digits a run has
        in_shape = list(_NUMBER.finditer(shape))
        if len(in_shape) == len(matches):
            _FAST[shape] = [
                (role[0], m.start("num"), m.end("num")) for m, role in zip(in_shape, roles, strict=True) if role
            ]
    out: dict[str, float] = {}
    for m, role in zip(matches, roles, strict=True):
        if role is None:
            continue
        try:
            value = float(m.group("num"))
        except ValueError:
            value = math.nan
        out.setdefault(role[0], value)
    return out


def fast_spans(shape: str) -> list[tuple[str, int, int]] | None:
    """(key, start, end) of each value's digits in a loss-line shape, where
    ``line_values`` has planned that shape for its fast path; None where not yet."""
    return _FAST.get(shape)


def _plan_raw(body: str, matches: list[re.Match[str]]) -> list[_Role]:
    """The plan of a raw line: numbers inside dates and clock times are no values."""
    if not (":" in body or "-" in body):
        return _plan(body, matches)
    text = _TIMES.sub(lambda m: " " * len(m.group(0)), body)  # same length: spans agree
    blanked = list(_NUMBER.finditer(text))
    at = {m.start(): role for m, role in zip(blanked, _plan(text, blanked), strict=True)}
    return [at.get(m.start()) if text[m.start()] != " " else None for m in matches]


# Keys that number the step a line was printed at (normalised), most telling first.
STEP_KEYS = (
    "global_step",
    "step",
    "train_step",
    "iteration",
    "iter",
    "num_updates",
    "update",
    "updates",
    "it",
)
