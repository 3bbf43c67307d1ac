"""Small helpers several checks share (not checks themselves)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

from syncdoctor.preflight.environment import EnvSnapshot

T = TypeVar("T")
VISIBLE = ("ASCEND_RT_VISIBLE_DEVICES", "ASCEND_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES")


def repeats(items: Iterable[T], key: Callable[[T], Any]) -> Iterator[tuple[T, T, int]]:
    """(first item, repeating item, count) once per key value that occurs more than
    once, at its second occurrence; None keys are skipped."""
    key = _hashable(key)
    first: dict[Any, T] = {}
    count: dict[Any, int] = {}
    for item in items:
        k = key(item)
        if k is None:
            continue
        count[k] = count.get(k, 0) + 1
        if k not in first:
            first[k] = item
    reported: set[Any] = set()
    for item in items:
        k = key(item)
        if k is not None and count[k] > 1 and first[k] is not item and k not in reported:
            reported.add(k)
            yield first[k], item, count[k]


def _hashable(key: Callable[[T], Any]) -> Callable[[T], Any]:
    """Rank-table values are kept as the file spells them, and a hand-edited file can
    put a list or an object where a string belongs: compare those by their JSON text."""

    def wrapped(item: T) -> Any:
        k = key(item)
        try:
            hash(k)
        except TypeError:
            return json.dumps(k, sort_keys=True, default=str)
        return k

    return wrapped


def visible_devices(snap: EnvSnapshot) -> list[str] | None:
    """The device list a process was restricted to, None when it was not."""
    value = snap.get(*VISIBLE)
    return [v.strip() for v in value.split(",") if v.strip()] if value is not None else None
