from __future__ import annotations

from typing import Any

from syncdoctor.doctor.evidence import Evidence
from syncdoctor.doctor.model import Finding
from syncdoctor.doctor.rules.base import Rule


class SummedGradients(Rule):
    """Gradients are summed across ranks instead of averaged.

    **Symptom:** the effective learning rate is N× the intended one: the loss
    jumps or diverges as soon as more cards join.

    **Cause:** `gradients_mean=False` in MindSpore's auto-parallel context, a
    `DistributedGradReducer` built with `mean=False` (or a `degree` that is not the
    number of ranks it reduces over), an all-reduce with SUM and no division in a
    hand-written loop or comm hook.

    **Quick check:** print the reducer's settings (`mean`, `degree`) beside
    `get_auto_parallel_context("gradients_mean")` and the group size on every rank;
    or compare the gradient norm after the reduction with the ranks' local norms: an
    average can never be larger than their mean.

    **Fix:** average the gradients: `set_auto_parallel_context(gradients_mean=True)` and
    `nn.DistributedGradReducer(params)` (MindSpore: mean and degree then come from the
    context and the group; pass `mean=True` and `degree=get_group_size()` if you pass
    them at all); divide by the world size after `all_reduce(SUM)` in custom loops and
    comm hooks, or keep DDP's default hook. A sum is right only with the learning
    rate divided by the world size for it.
    """

    code = "SD403"
    name = "summed-gradients"
    category = "sync.reduce_op"
    stage = "reduced"
    title = "Gradients summed across ranks, not averaged"

    def evaluate(self, ev: Evidence) -> Finding | None:
        settings = _reducer_settings(ev)
        if settings:
            found = self._from_reducer(ev, settings)
            if found is not None or all(s["mean"] is True for s in settings.values()):
                # A reducer that averages decides, whatever the context says (it is read
                # only by reducers built without `mean`): only the measured ratio remains.
                return found or self._from_ratio(ev)
        means = ev.snapshot_values("ddp", "gradients_mean")
        if any(v is False for v in means.values()):
            return self.found(0.95, ["parallel context: gradients_mean=False"], ranks=ev.ranks)
        return self._from_ratio(ev)

    def _from_reducer(self, ev: Evidence, settings: dict[int, dict[str, Any]]) -> Finding | None:
        """The reducer's own settings, at step 0, side by side per rank."""
        described = {r: _describe(s) for r, s in sorted(settings.items())}
        if len(set(described.values())) == 1:
            table = f"on every rank ({len(described)}): {next(iter(described.values()))}"
        else:
            table = "; ".join(f"rank {r}: {d}" for r, d in described.items())
        summing = [r for r, s in settings.items() if s["mean"] is False]
        if summing:
            asked = [r for r in summing if settings[r]["context_mean"] is True]
            n = max((settings[r]["group_size"] or 0) for r in summing) or "N"
            if asked:
                # The context asks for the mean and the reducer was told to sum: a
                # contradiction, unless the learning rate was divided by N for it (a sum
                # with lr/N is a mean), which the records cannot tell.
                return self.found(
                    0.85,
                    [
                        f"the gradient reducer sums while the parallel context asks for the mean "
                        f"(gradients_mean=True): the update is {n}x the averaged one on every rank "
                        f"(at step 0, before any update): {table}",
                        f"right only if the learning rate was divided by {n} for the sum; "
                        "the records cannot tell, so this is a warning",
                    ],
                    ranks=sorted(summing),
                    step=0,
                    severity="warning",
                    direct=True,
                )
            return self.found(
                0.95,
                [f"parallel context: gradients_mean=False and the gradient reducer sums (at step 0): {table}"],
                ranks=ev.ranks,
                step=0,
                direct=True,
            )
        off = [
            r
            for r, s in settings.items()
            if s["mean"] is True and s["degree"] and s["group_size"] and s["degree"] != s["group_size"]
        ]
        if off:
            r = off[0]
            degree, size = settings[r]["degree"], settings[r]["group_size"]
            return self.found(
                0.9,
                [
                    f"the gradient reducer divides the sum by degree={degree} while it reduces over {size} ranks: "
                    f"the update is {size}/{degree} of the averaged one (at step 0): {table}"
                ],
                ranks=sorted(off),
                step=0,
                direct=True,
            )
        return None

    def _from_ratio(self, ev: Evidence) -> Finding | None:
        excess = ev.reduce.excess
        if excess is None or excess["above_one"] < 0.3:
            return None
        return self.found(
            0.9,
            [
                f"post-reduce gradient norm exceeds the ranks' mean local norm at {excess['above_one']:.0%} of "
                f"{excess['steps']} measured steps (median ratio {excess['median']:.2f}); an average is never larger",
            ],
            ranks=ev.ranks,
        )


def _reducer_settings(ev: Evidence) -> dict[int, dict[str, Any]]:
    """Per rank that recorded a gradient reducer (MindSpore's DistributedGradReducer):
    its mean, degree and group size, and the context's gradients_mean."""
    out: dict[int, dict[str, Any]] = {}
    for rank, snap in ev.snapshots.items():
        ddp = snap.get("ddp")
        if not isinstance(ddp, dict) or not isinstance(ddp.get("reducer_mean"), bool):
            continue
        size = ddp.get("reducer_group_size")
        degree = ddp.get("reducer_degree")
        out[rank] = {
            "mean": ddp["reducer_mean"],
            "mean_from": ddp.get("reducer_mean_from"),
            "degree": degree if isinstance(degree, int) else None,
            "group_size": size if isinstance(size, int) else snap.get("world_size"),
            "context_mean": ddp.get("gradients_mean"),
        }
    return out


def _describe(s: dict[str, Any]) -> str:
    mean = f"mean={s['mean']}" + (" (from the context)" if s["mean_from"] == "context" else "")
    return f"{mean}, degree={s['degree']}, group of {s['group_size']}, context gradients_mean={s['context_mean']}"
