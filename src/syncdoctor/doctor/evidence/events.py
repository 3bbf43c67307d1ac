"""Communication and process events, from the logs and the records: by kind, the
first failure, the probe's own events (rebuilds, self-disabling), ranks that ended
early, and the picture of a hang."""

from __future__ import annotations

from functools import cached_property
from typing import Any, cast

import polars as pl

from syncdoctor.doctor.evidence.sources import Facet
from syncdoctor.doctor.model import Event
from syncdoctor.records import contract

FAILURE_KINDS = ("crash", "oom")


class Events(Facet):
    """``ev.events``: every event (``all``), the real ones (``real``, ``of(kind, ...)``) and what they tell."""

    @cached_property
    def all(self) -> list[Event]:
        events: list[Event] = list(self.ev.logs.events) if self.ev.logs is not None else []
        if self.ev.records is not None:
            for e in self.ev.records.events:
                events.append(
                    Event(
                        kind=str(e.get("event", "info")),
                        raw=str(e.get("message", "")),
                        source=f"records/rank{e.get('rank')}.jsonl",
                        rank=e.get("rank"),
                        t=e.get("t"),
                        step=e.get("step"),
                    )
                )
        return events

    @cached_property
    def real(self) -> list[Event]:
        return [e for e in self.all if not e.benign and e.kind != "info"]

    def of(self, *kinds: str) -> list[Event]:
        return [e for e in self.real if e.kind in kinds]

    @cached_property
    def rebuilt_after(self) -> list[int]:
        """Steps after which the job rebuilt its model in the same process (a new wrapper
        or optimizer over the same parameters: the probe's `rebound` event), in order;
        each starts a new segment of the record."""
        events = self.ev.records.events if self.ev.records is not None else []
        return sorted(
            {
                int(e["step"])
                for e in events
                if e.get("event") == contract.REBOUND_EVENT and isinstance(e.get("step"), int)
            }
        )

    @cached_property
    def joined(self) -> set[int]:
        """Ranks that trained under torch's `Join` (the probe's `join` event): uneven
        inputs handled by design, their step counts may differ."""
        events = self.ev.records.events if self.ev.records is not None else []
        return {
            int(e["rank"]) for e in events if e.get("event") == contract.JOIN_EVENT and isinstance(e.get("rank"), int)
        }

    @cached_property
    def heals(self) -> list[dict[str, Any]]:
        """The probe's heal records (on_mismatch="heal"), one per rank and heal."""
        events = self.ev.records.events if self.ev.records is not None else []
        return [
            e
            for e in events
            if e.get("event") == "heal" and isinstance(e.get("heal"), dict) and isinstance(e.get("step"), int)
        ]

    def rebuilt_within(self, after: int | None, upto: int) -> int | None:
        """The last rebuild in (after, upto): a parting bracketed there may be the rebuild's."""
        inside = [s for s in self.rebuilt_after if (after is None or s >= after) and s < upto]
        return inside[-1] if inside else None

    @cached_property
    def first_failure(self) -> Event | None:
        """The earliest crash or out-of-memory: the rank that started it, not the
        ranks that then lost their peer."""
        failures = self.of(*FAILURE_KINDS)
        if not failures:
            return None
        timed = [e for e in failures if e.t is not None]
        return min(timed, key=lambda e: cast(float, e.t)) if timed else failures[0]  # timed: t is set

    @cached_property
    def probe_disabled(self) -> dict[int, tuple[int | None, str]]:
        """Ranks whose probe disabled itself (an exception inside the probe): from that
        step on nothing was recorded or checked there. {rank: (step, message)}"""
        out: dict[int, tuple[int | None, str]] = {}
        for e in self.ev.records.events if self.ev.records is not None else []:
            message = str(e.get("message", ""))
            if message.startswith("probe disabled") and isinstance(e.get("rank"), int):
                out.setdefault(e["rank"], (e.get("step"), message))
        return out

    @cached_property
    def ended_early(self) -> list[int]:
        """Ranks whose records stop without an end record (killed, crashed)."""
        if self.ev.records is None:
            return []
        return sorted(r for r in self.ev.records.ranks if r not in self.ev.records.ends)

    @cached_property
    def hang_picture(self) -> dict[int, dict[str, Any]]:
        """From the logs of a job that timed out: for each rank, the last step it
        printed before its own first wait or timeout, and that first wait (or none:
        the rank never said it waited: it was busy elsewhere, or it ended).
        {rank: {"last_step", "wait", "ended"}} ("ended": the rank logged a crash, an
        out-of-memory or an exit); empty when nothing timed out or failed on the
        network, or fewer than two ranks printed steps."""
        waits = [e for e in self.of("timeout", "watchdog", "network") if e.rank is not None]
        if not waits or self.ev.has_records or not self.ev.losses.height or self.ev.logs is None:
            return {}
        first: dict[int, Event] = {}
        for e in waits:
            best = first.get(int(e.rank))  # type: ignore[arg-type] # rank is set: filtered above
            if best is None or (e.t is not None and best.t is not None and e.t < best.t):
                first[int(e.rank)] = e  # type: ignore[arg-type]
        rows = self.ev.logs.losses.filter(pl.col("rank").is_not_null() & pl.col("step").is_not_null())
        out: dict[int, dict[str, Any]] = {}
        for (rank,), part in rows.group_by(["rank"]):
            wait = first.get(int(rank))
            if wait is not None and wait.source in set(part["source"].to_list()) and wait.line is not None:
                part = part.filter((pl.col("source") != wait.source) | (pl.col("line") < wait.line))
            if part.height:
                ended = any(e.rank == rank for e in self.of("crash", "oom", "exit"))
                out[int(rank)] = {"last_step": int(part["step"].max()), "wait": wait, "ended": ended}
        return out if len(out) > 1 else {}
