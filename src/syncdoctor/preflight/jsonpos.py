"""JSON with source positions: every object parsed remembers where it starts, so a
rank-table finding can point at the line of the offending device entry."""

from __future__ import annotations

import bisect
import json
from json import decoder, scanner
from typing import Any


class PosDict(dict):
    """A JSON object that knows its span [start, end) in the source text."""

    start: int = 0
    end: int = 0


class LineIndex:
    def __init__(self, text: str) -> None:
        self.text = text
        self._starts = [0] + [i + 1 for i, ch in enumerate(text) if ch == "\n"]

    def position(self, offset: int) -> tuple[int, int]:
        """1-based (line, column) of a character offset."""
        line = bisect.bisect_right(self._starts, offset)
        return line, offset - self._starts[line - 1] + 1

    def key_position(self, obj: Any, key: str) -> tuple[int, int]:
        """Where `"key"` appears inside `obj`'s span; the object's start if not found."""
        if not isinstance(obj, PosDict):
            return 1, 1
        found = self.text.find(json.dumps(key), obj.start, obj.end)
        return self.position(found if found >= 0 else obj.start)


def _parse_object(
    s_and_end: tuple[str, int], strict: bool, scan_once: Any, object_hook: Any, object_pairs_hook: Any, memo: Any = None
) -> tuple[Any, int]:
    start = s_and_end[1] - 1
    obj, end = decoder.JSONObject(s_and_end, strict, scan_once, None, PosDict, memo)  # type: ignore[attr-defined]  # pure-Python helper, absent from typeshed
    obj.start, obj.end = start, end
    return obj, end


class _PosDecoder(json.JSONDecoder):
    def __init__(self) -> None:
        super().__init__(object_pairs_hook=PosDict)
        self.parse_object = _parse_object
        # The C scanner ignores parse_object; the pure-Python one calls it.
        self.scan_once = scanner.py_make_scanner(self)  # type: ignore[attr-defined]  # absent from typeshed


def loads_with_positions(text: str) -> tuple[Any, LineIndex]:
    """Parse `text`; raises json.JSONDecodeError (with lineno/colno) when malformed."""
    return _PosDecoder().decode(text), LineIndex(text)
