from __future__ import annotations

import re
from typing import Any

import polars as pl

from syncdoctor.doctor.evidence import Evidence
from syncdoctor.doctor.model import Finding
from syncdoctor.doctor.must_equal import describe
from syncdoctor.doctor.rules.base import Rule
from syncdoctor.records.compare import agreement, describe_split
from syncdoctor.rulebook import fmt_ranks

# A waiting rank's peer process went away (gloo, NCCL, torch's own words).
_PEER_GONE = re.compile(
    r"closed by (?:peer|remote)|connection reset by peer|remote (?:process|worker|peer) (?:exited|crash)", re.I
)


class StepMisalignment(Rule):
    """Ranks are not on the same step: update or accumulation counters differ.

    **Symptom:** no error; replicas part after one rank skipped or repeated an
    update, or ran one micro-step more per accumulation cycle; the job may hang at
    the end waiting for a collective the others never make.

    **Cause:** a rank-dependent path around `optimizer.step()` or the
    accumulation counter (data length differs, an off-by-one `(i+1) % N`, a
    per-rank overflow skip), so ranks do not execute the same step semantics.

    Only a note (info) where the ranks split each update into different numbers of
    micro-steps but read as many samples per update and make one synchronised
    backward() last (a smaller micro-batch on a rank short of memory, compensated by
    accumulation): the all-reduces pair one to one and the replicas stay equal.

    From logs alone: an update or epoch counter the ranks print differently at the
    same step.

    **Quick check:** log micro-steps per update and optimizer-step counts per rank.

    **Fix:** give every rank the same number of micro-steps and optimizer steps: derive
    the accumulation counter from the global step, use equal shards (drop_remainder),
    and keep `optimizer.step()` and any skip logic free of rank-dependent conditions.
    """

    code = "SD402"
    name = "step-misalignment"
    category = "sync.step_misalignment"
    stage = "sync_schedule"
    title = "Step counters differ across ranks"
    sources = ("records", "logs")

    def evaluate(self, ev: Evidence) -> Finding | None:
        div = ev.replicas.divergence
        micro = ev.replicas.micro_by_rank
        uneven_micro = len(set(micro.values())) > 1
        if not (div and "counter" in div.what) and not uneven_micro:
            return self._from_logs(ev) if not ev.has_records else self._left_while_others_waited(ev)
        evidence = []
        ranks = set(div.ranks if div else [])
        step = div.step if div else None
        if div and "counter" in div.what:
            table = ev.replicas.counter_table
            parts = [
                f"{name} {describe_split(table[name])}"
                for name in ("micro", "backward", "opt_steps")
                if name in table and len(set(table[name].values())) > 1
            ]
            evidence.append(f"at step {div.step} counters differ: " + "; ".join(parts))
        if uneven_micro:
            split = agreement(micro)
            evidence.append(
                "micro-steps per update: "
                + describe_split(micro)
                + ("" if split.has_majority else "; no majority to tell which rank is off")
            )
            ranks.update(split.odd)
        off = self._off_their_rhythm(ev, step)
        if off and len(off) < len(ranks):
            # No majority between the ranks, but the job's own rhythm names the rank
            # that ran a backward without a step (or a step without a backward).
            evidence.append(f"{fmt_ranks(off)} left the run's usual rhythm of micro-steps per update at step {step}")
            ranks = set(off)
        if div and {"param", "opt"} & set(div.what):
            evidence.append(f"parameters/optimizer state part at step {div.step}")
        elif div:
            evidence.append("parameters stay identical: the extra work is silent (only counters reveal it)")
        discarded = self._discarded(ev)
        if discarded:
            evidence.append(
                "not counted as micro-steps: no_sync backward passes whose gradients zero_grad threw away before "
                "any update read them (" + ", ".join(f"{n} on rank {r}" for r, n in sorted(discarded.items())) + ")"
            )
        confidence = 0.6 if ev.numerics.overflow_disagreement else 0.9
        same_work = ev.reduce.same_work_per_update
        if same_work is not None and not (div and {"param", "opt"} & set(div.what)):
            # Different micro-batch layouts, the same work per update: a note, not a fault
            # (the replicas stay equal whatever each rank's loss weighting is).
            layouts = "; ".join(
                f"rank {r}: {m} micro-step{'s' if m > 1 else ''}, {n} samples"
                for r, (m, n) in sorted(same_work.items())
            )
            evidence.append(
                f"per update ({layouts}): every rank reads as many samples and makes one synchronised backward() "
                "last, so the all-reduces pair one to one; right as long as each rank divides its loss by its "
                "own number of micro-steps (an undivided sum weighs the accumulating rank's batch more)"
            )
            return self.found(
                0.5,
                evidence,
                ranks=sorted(ranks),
                step=step,
                severity="info",
                title="Ranks split each update into different numbers of micro-steps",
            )
        return self.found(confidence, evidence, ranks=sorted(ranks), step=step, tensor=div.tensor if div else None)

    @staticmethod
    def _discarded(ev: Evidence) -> dict[int, int]:
        """Per rank, the no_sync backward passes the probe left out of the counters
        (probe field discarded): a trailing batch dropped by zero_grad."""
        most = ev.steps.group_by("rank").agg(pl.col("discarded").max().alias("n")).drop_nulls()
        return {int(r): int(n) for r, n in most.iter_rows() if n}

    def _from_logs(self, ev: Evidence) -> Finding | None:
        p = ev.settings.log_partings.get("counter")
        if p is None:
            return self._hung_apart(ev)
        return self.found(
            0.85,
            [
                "the ranks print a different update counter: "
                + describe(p, describe_split)
                + (f" ({p.where})" if p.where else "")
            ],
            ranks=agreement({r: repr(v) for r, v in p.values.items()}).odd,
            step=p.step,
            direct=True,
        )

    def _left_while_others_waited(self, ev: Evidence) -> Finding | None:
        """From the end records: some ranks left training normally after their last
        update while the others were still inside the next one (a backward that
        all-reduces, by `pending_syncs`) or further on, and ended waiting for them.
        The ranks did not run the same number of updates: the ones still training had
        more batches (uneven data per rank), and their timeout is the consequence."""
        ends = ev.records.ends if ev.records is not None else {}
        done = {r: int(e.get("step") or 0) for r, e in ends.items() if e.get("status") == "ok"}
        stuck = {r: e for r, e in ends.items() if e.get("status") == "exception"}
        if not done or not stuck or not ev.events.of("timeout", "watchdog", "network"):
            return None
        last = max(done.values())
        on = {
            r: e for r, e in stuck.items() if int(e.get("step") or 0) > last or "s" in str(e.get("pending_syncs") or "")
        }
        if not on or any(int(e.get("step") or 0) < last for e in stuck.values()):
            return None
        evidence = [
            f"{fmt_ranks(sorted(done))} left training normally after update {last}",
        ]
        for r, end in sorted(on.items()):
            step = int(end.get("step") or 0)
            pending = str(end.get("pending_syncs") or "")
            where = (
                f"inside update {step + 1} (backward calls {pending!r}, s: DDP all-reduced)"
                if pending
                else f"after update {step}"
            )
            evidence.append(f"rank {r} was still training, {where}, and ended on: {str(end.get('message'))[:120]}")
        evidence.append(
            "the ranks did not run the same number of updates: the ones still training had more batches "
            "(a dataset or sampler that does not give every rank the same number); the timeout or closed "
            "connection they then met is the consequence"
        )
        direct = any(e.get("pending_syncs") for e in on.values())
        return self.found(
            0.85 if direct else 0.75,
            evidence,
            ranks=sorted(on),
            step=last + 1,
            direct=direct,
            title="The ranks ran different numbers of updates: some left while the others still trained",
        )

    @staticmethod
    def _print_interval(ev: Evidence) -> int:
        gaps = ev.losses.sort("rank", "step").group_by("rank").agg(pl.col("step").diff().median().alias("g"))
        return int(max((g for g in gaps["g"].to_list() if g is not None), default=1))

    def _hung_apart(self, ev: Evidence) -> Finding | None:
        """A hang read as who waited for whom: the ranks stopped at steps further apart
        than one print interval before their first timeout. The rank behind is where the
        job stopped; the others' timeouts are the consequence."""
        picture = ev.events.hang_picture
        if not picture:
            return None
        last = {r: info["last_step"] for r, info in picture.items()}
        lo, hi = min(last.values()), max(last.values())
        if hi - lo <= self._print_interval(ev):
            return self._finished_while_waited(picture)
        behind = sorted(r for r, s in last.items() if s == lo)
        evidence = ["the ranks stopped at different steps: " + describe_split(last, lambda s: f"last step {s}")]
        for r in sorted(picture):
            wait = picture[r]["wait"]
            if wait is not None:
                evidence.append(f"rank {r} then waited: {wait.source}:{wait.line}: {wait.raw[:160]}")
            else:
                evidence.append(f"rank {r} never reported a wait: it was busy elsewhere while the others waited")
        evidence.append("the timeouts are the consequence: the ranks were in different steps' collectives")
        return self.found(0.85, evidence, ranks=behind, step=lo)

    def _finished_while_waited(self, picture: dict[int, dict[str, Any]]) -> Finding | None:
        """Ranks at the same last step: some waited and lost their peer ("connection
        closed by peer"), the others logged no wait, no error and no end of their own,
        so they left the training loop normally. The waiting ranks made a collective
        the others never made (an extra batch, an extra step): the closed connection is
        the consequence."""
        waiting = sorted(r for r, i in picture.items() if i["wait"] is not None)
        quiet = sorted(r for r, i in picture.items() if i["wait"] is None and not i["ended"])
        if not waiting or not quiet:
            return None
        closed = [picture[r]["wait"] for r in waiting if _PEER_GONE.search(picture[r]["wait"].raw)]
        if len(closed) != len(waiting):
            return None
        if min(picture[r]["last_step"] for r in quiet) < max(picture[r]["last_step"] for r in waiting):
            return None
        first = closed[0]
        evidence = [
            f"{fmt_ranks(waiting)} waited in a collective after step {picture[waiting[0]]['last_step']} and lost "
            f"the peer: {first.source}:{first.line}: {first.raw[:160]}",
            f"{fmt_ranks(quiet)} logged the same last step and no wait, error or crash: "
            f"{'it' if len(quiet) == 1 else 'they'} left the loop while the others still had a collective to make",
            "the ranks did not make the same number of collectives (uneven data or an extra step on one side); "
            "if a quiet rank was killed from outside (the OOM killer), its launcher's log says so",
        ]
        return self.found(0.75, evidence, ranks=waiting, step=picture[waiting[0]]["last_step"])

    @staticmethod
    def _off_their_rhythm(ev: Evidence, step: int | None) -> list[int]:
        """Ranks whose micro-steps at `step` differ from what every rank does at most
        steps (the mode over the whole run)."""
        if step is None or not ev.has_records:
            return []
        # (sorted: between two equally usual counts, the same one on every run)
        usual = ev.steps["micro"].drop_nulls().mode().sort()
        if not usual.len():
            return []
        at = ev.steps.filter(pl.col("step") == step)
        return sorted(int(r) for r, m in zip(at["rank"], at["micro"], strict=True) if m is not None and m != usual[0])
