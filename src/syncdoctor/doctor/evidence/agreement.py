"""The replica-agreement timeline: at each parameter check, which ranks held the
majority's parameters, in runs of checks with the same outcome."""

from __future__ import annotations

from functools import cached_property
from typing import Any

import polars as pl

from syncdoctor.doctor.evidence.sources import Facet


class Agreement(Facet):
    """``ev.agreement``: the outcome of every parameter check, and the timeline of them."""

    @cached_property
    def per_check(self) -> list[tuple[int, list[int]]]:
        """(step, odd ranks) at every step where two or more ranks fingerprinted their
        parameters; odd as records.compare.agreement has it: outside a strict
        majority, or every rank of a split without one."""
        if not self.ev.has_records or "param_fp" not in self.ev.steps.columns:
            return []
        rows = self.ev.steps.filter(pl.col("param_fp").is_not_null()).select("step", "rank", "param_fp")
        if not rows.height:
            return []
        groups = rows.group_by("step", "param_fp").agg(pl.len().alias("k"), pl.col("rank").min().alias("lo"))
        reference = (
            groups.sort(["step", "k", "lo"], descending=[False, True, False])
            .unique("step", keep="first", maintain_order=True)
            .select("step", pl.col("param_fp").alias("_ref"), pl.col("k").alias("_top"))
        )
        per_check = (
            rows.join(reference, on="step")
            .group_by("step")
            .agg(
                pl.len().alias("n"),
                pl.col("_top").first().alias("top"),
                pl.col("rank").filter(pl.col("param_fp") != pl.col("_ref")).sort().alias("odd"),
                pl.col("rank").sort().alias("all"),
            )
            .filter(pl.col("n") > 1)
            .sort("step")
        )
        return [
            (int(s), list(odd) if top * 2 > n or not odd else list(every))
            for s, n, top, odd, every in per_check.select("step", "n", "top", "odd", "all").iter_rows()
        ]

    @cached_property
    def timeline(self) -> list[dict[str, Any]]:
        """The replica-agreement timeline: runs of consecutive parameter checks with
        the same outcome, as dicts of AgreementSpan's fields."""
        per_check = self.per_check
        if not per_check:
            return []
        reporting = (
            self.ev.steps.filter(pl.col("param_fp").is_not_null())
            .group_by("step")
            .agg(pl.col("rank").sort())
            .sort("step")
        )
        ranks_at = dict(zip(reporting["step"].to_list(), reporting["rank"].to_list(), strict=True))
        expected = set(range(self.ev.world_size)) if self.ev.world_size else set(self.ev.ranks)
        mismatches: dict[int, dict[str, Any]] = {}
        for c in self.ev.checks:
            if c.get("status") == "mismatch" and isinstance(c.get("step"), int):
                mismatches.setdefault(c["step"], c)
        spans: list[dict[str, Any]] = []
        for step, parted in per_check:
            present = ranks_at.get(step, [])
            missing = sorted(expected - set(present)) if len(present) < len(expected) else []
            key = (tuple(parted), tuple(missing))
            last = spans[-1] if spans else None
            if last is None or last["_key"] != key:
                last = {
                    "_key": key,
                    "first_step": step,
                    "last_step": step,
                    "checks": 0,
                    "ranks": len(present),
                    "parted": parted,
                    "missing": missing,
                    "what": [],
                    "tensor": None,
                    "no_majority": bool(parted) and len(parted) * 2 >= len(present),
                }
                spans.append(last)
            last["last_step"] = step
            last["checks"] += 1
        for span in spans:
            seen = [c for s, c in mismatches.items() if span["first_step"] <= s <= span["last_step"]]
            span["what"] = sorted({w for c in seen for w in c.get("what") or [] if isinstance(w, str)})
            span["tensor"] = next((c.get("tensor") for c in seen if c.get("tensor")), None)
            if span["parted"] and not span["what"]:
                span["what"] = ["param"]
            del span["_key"]
        return spans
