from __future__ import annotations

from typing import Any

import polars as pl

from syncdoctor.doctor.evidence import Evidence, int_of
from syncdoctor.doctor.evidence.replicas import confined
from syncdoctor.doctor.model import Finding
from syncdoctor.doctor.rules.base import Rule
from syncdoctor.rulebook import fmt_ranks

CORRUPTIBLE = {"param", "opt", "grad", "buffer"}  # what a flipped bit changes
BUG_MARKS = {
    "counter": "step counters",
    "config": "optimizer/loss configuration",
    "mode": "train/eval modes",
    "data": "data",
}
# Settings that must be alike on every rank (the loader's rank differs by design).
SNAPSHOT_ALIKE = (
    ("loss",),
    ("optimizer", "param_groups"),
    ("optimizer", "n_params"),
    ("ddp",),
    ("global_batch",),
    ("loader", "seed"),
    ("loader", "shuffle"),
    ("loader", "epoch"),
    ("loader", "pipeline"),
    ("loader", "shuffle_op"),
    ("loader", "shuffle_buffer"),
    ("loader", "num_replicas"),
    ("code", "entry_sha256"),
    ("tensors",),
)
DEVICE_ENV = ("CUDA_VISIBLE_DEVICES", "ASCEND_DEVICE_ID", "DEVICE_ID", "LOCAL_RANK")


def device_of(ev: Evidence, rank: int) -> dict[str, Any]:
    """Where a rank ran: host and device, from its snapshot."""
    snap = ev.snapshots.get(rank, {})
    env = raw_env if isinstance(raw_env := snap.get("env"), dict) else {}
    device = next((f"{k}={env[k]}" for k in DEVICE_ENV if env.get(k) not in (None, "")), None)
    if device is None and isinstance(snap.get("local_rank"), int):
        device = f"LOCAL_RANK={snap['local_rank']}"
    return {"rank": rank, "host": snap.get("host") if isinstance(snap.get("host"), str) else None, "device": device}


def where(ev: Evidence, rank: int) -> str:
    d = device_of(ev, rank)
    parts = [p for p in (f"host {d['host']}" if d["host"] else None, d["device"]) if p]
    return f"rank {rank}" + (f" ({', '.join(parts)})" if parts else "")


class SilentCorruption(Rule):
    """One replica's state changed on its own: the mark of silent hardware corruption.

    **Symptom:** no error anywhere; at one check one rank's parameters (or its
    optimizer state, or its reduced gradients) stop being bitwise equal to the
    other ranks', while everything a bug would change still agrees — step counters,
    the optimizer and loss configuration, train/eval modes, the data — and the
    difference is confined to one or a few tensors (code that treats a rank apart,
    such as clipping, a weight copy or a skipped reduction, changes most of them). The loss may
    not move at all, drift, or blow up, depending on which bit flipped.

    **Cause:** a chip or memory cell that computes or stores a wrong value without
    raising anything (silent data corruption): a flipped bit in a weight, in the
    gradient after the all-reduce, or in the optimizer's moments. A software bug
    leaves other marks: a configuration, seed or data difference, replicas that
    differ from the first step, counters that part, or a replica that parts again
    and again (an incomplete reduction).
    With three or more ranks the strict majority names the odd replica, its rank and
    host; with two nothing says which one changed. Across several runs, a host (and
    device) named again and again is the faulty one.

    **Quick check:** `syncdoctor diagnose RUN1 RUN2 …` over the job's runs: does the
    same host come up? Run the vendor's diagnostics on it (e.g. NVIDIA DCGM
    `dcgmi diag -r 3`, its ECC/XID counters in `nvidia-smi -q`; `npu-smi` on
    Ascend). With two ranks, a third replica or recomputing the step on another
    device tells which copy is wrong.

    **Fix:** take the named host or device out of the pool (or swap the card), and
    resume from the last checkpoint taken before the step named here. To keep
    training through a rare flip, run with `--on-mismatch heal` (3+ ranks): the odd
    replica is restored from the majority at the next check.
    """

    code = "SD971"
    name = "silent-corruption"
    category = "hardware.corruption"
    stage = "params"
    title = "Silent data corruption: one replica changed while counters, configuration and data agree"

    def evaluate(self, ev: Evidence) -> Finding | None:
        div = ev.replicas.divergence
        if div is None or not div.what or not set(div.what) <= CORRUPTIBLE:
            return None
        if len(div.detail.get("groups") or []) > 1:
            return None  # several replica groups parted at once: one cause for all, not a flipped bit
        checks = sorted((c for c in ev.checks if c.get("status") == "mismatch"), key=lambda c: c["step"])
        bug_marks = sorted({BUG_MARKS[w] for c in checks for w in c.get("what", []) if w in BUG_MARKS})
        if bug_marks or self._setup_differs(ev) or self._other_mechanism(ev, div.step):
            return None
        first_measured = self._first_measured_step(ev)
        if first_measured is None or div.step <= first_measured:
            return None  # apart from the start: initialisation or set-up, not a flip
        if ev.events.rebuilt_within(div.last_agree_step, div.step) is not None:
            return None  # apart from a rebuild's start: the state loaded, not a flip (SD505)
        rebound = ev.replicas.rebound
        if rebound is not None and rebound.step <= div.step:
            return None  # parameters replaced by code on some ranks: a software cause seen (SD509)
        reach = ev.replicas.tensors_parted(div.step)
        if reach is not None and not confined(reach):
            return None  # most tensors changed at once: a rank treated apart by code, not a flip
        world = ev.world_size or len(ev.ranks)
        heals = [e for e in ev.events.heals if e["heal"].get("status") == "healed"]
        if self._parts_again_after_heal(ev, heals, checks):
            return None  # it came back at once after a heal: a persistent fault, another rule's
        odd = self._odd_ranks(ev, div.ranks, world)
        labels = {"param": "parameters", "opt": "optimizer state", "grad": "reduced gradients", "buffer": "buffers"}
        parted = ", ".join(labels[w] for w in sorted(div.what, key=list(labels).index))
        tensor = f" (first: {div.tensor})" if div.tensor else ""
        agree = "step counters, optimizer/loss configuration, train/eval modes and data agree"
        if odd:
            culprit = ", ".join(where(ev, r) for r in odd)
            evidence = [
                f"{culprit} parted from the other {world - len(odd)} ranks at step {div.step}: "
                f"{parted}{tensor}; {agree}"
            ]
            title = f"Silent data corruption on {culprit}: its replica changed alone at step {div.step}"
            confidence = 0.93
        else:
            evidence = [
                f"{fmt_ranks(div.ranks)} parted at step {div.step}: {parted}{tensor}; {agree}",
                "no strict majority (two replicas, or an even split): nothing says which copy changed; "
                "a third replica, or recomputing the step on another device, would tell",
            ]
            title = (
                f"Silent data corruption suspected at step {div.step}: one of {fmt_ranks(div.ranks)} changed, "
                "which one cannot be told"
            )
            confidence = 0.88
        evidence.append(f"the replicas were bitwise equal at every check before step {div.step}")
        if reach is not None:
            evidence.append(
                f"{reach[0]} of {reach[1]} tensors differ: a change confined to few tensors, as one flipped "
                "value makes (the all-reduce keeps the others equal)"
            )
        for heal in self._heal_lines(ev, heals, checks):
            evidence.append(heal)
        confidence += 0.03 if heals else 0.0
        return self.found(confidence, evidence, ranks=odd or div.ranks, step=div.step, tensor=div.tensor, title=title)

    @staticmethod
    def _setup_differs(ev: Evidence) -> bool:
        return any(ev.differing(*path) for path in SNAPSHOT_ALIKE)

    @staticmethod
    def _other_mechanism(ev: Evidence, step: int) -> bool:
        """Marks of the mechanisms that part replicas without a flipped bit: a rank
        left out of the reduction, a local overflow skip, gradients changed between the
        reduction and the update, a communication retry."""
        if ev.reduce.unreduced_ranks or ev.numerics.overflow_disagreement or ev.reduce.changed_after_reduce:
            return True
        if any(e.step is None or e.step <= step for e in ev.events.of("retry", "timeout", "watchdog", "network")):
            return True
        # Reduced gradients that still differ at the last step they were measured: a
        # reduction that keeps leaving someone out, not one flipped value.
        if "grad_fp" in ev.steps.columns:
            measured = (
                ev.steps.filter(pl.col("grad_fp").is_not_null() & (pl.col("step") > step))
                .group_by("step")
                .agg(pl.col("grad_fp").n_unique().alias("k"), pl.len().alias("n"))
                .filter(pl.col("n") > 1)
                .sort("step")
            )
            if measured.height and measured["k"][-1] > 1:
                return True
        return False

    @staticmethod
    def _first_measured_step(ev: Evidence) -> int | None:
        measured = ev.steps.filter(pl.col("param_fp").is_not_null()) if ev.has_records else ev.steps
        return int_of(measured["step"].min()) if measured.height else None

    @staticmethod
    def _odd_ranks(ev: Evidence, ranks: list[int], world: int) -> list[int]:
        """The culprit: only ranks outside a strict majority."""
        return sorted(ranks) if ranks and 2 * len(ranks) < world else []

    @staticmethod
    def _parts_again_after_heal(ev: Evidence, heals: list[dict[str, Any]], checks: list[dict[str, Any]]) -> bool:
        """A replica that parts again at the first check after being healed: not a
        transient flip (a heal's own check already sees the restored state)."""
        if any("persistent" in str(e["heal"].get("reason")) for e in ev.events.heals):
            return True
        every = next((s["check_every"] for s in ev.snapshots.values() if isinstance(s.get("check_every"), int)), 1)
        steps = {int(e["step"]) for e in heals}
        return any(s < c["step"] <= s + every for s in steps for c in checks)

    @staticmethod
    def _heal_lines(ev: Evidence, heals: list[dict[str, Any]], checks: list[dict[str, Any]]) -> list[str]:
        lines = []
        seen: set[Any] = set()
        for e in sorted(heals, key=lambda e: e["step"]):
            heal = e["heal"]
            if heal.get("id") in seen:
                continue
            seen.add(heal.get("id"))
            cost = ""
            if isinstance(heal.get("bytes"), int) and isinstance(heal.get("seconds"), (int, float)):
                cost = f" ({heal['bytes']:,} bytes in {heal['seconds'] * 1e3:.1f} ms)"
            odd = [r for r in heal.get("odd") or [] if isinstance(r, int)] if isinstance(heal.get("odd"), list) else []
            lines.append(
                f"healed at step {e['step']}: {fmt_ranks(odd) if odd else 'the odd rank'} restored from rank "
                f"{heal.get('source')}{cost}"
            )
        if lines:
            last = max(int(e["step"]) for e in heals)
            later_ok = [c for c in ev.checks if c.get("status") == "ok" and c["step"] > last]
            if later_ok and not [c for c in checks if c["step"] > last]:
                lines.append(f"every check after the heal at step {last} agreed")
        aborted = {
            (e["step"], e["heal"].get("reason")) for e in ev.events.heals if e["heal"].get("status") == "aborted"
        }
        lines += [f"heal at step {st} aborted: {r}" for st, r in sorted(aborted, key=lambda a: a[0]) if r]
        refused = {e["heal"].get("reason") for e in ev.events.heals if e["heal"].get("status") == "refused"}
        lines += [f"not healed: {r}" for r in sorted(r for r in refused if isinstance(r, str))]
        return lines[:6]
