from __future__ import annotations

from syncdoctor.doctor.evidence import Evidence
from syncdoctor.doctor.model import Finding
from syncdoctor.doctor.rules.base import Rule
from syncdoctor.records.compare import agreement
from syncdoctor.rulebook import fmt_ranks


class GradientsChangedAfterReduce(Rule):
    """The all-reduce delivered the same gradient to every rank; the ranks then updated
    from different ones.

    **Symptom:** no error; the replicas part from the first update at which the change
    happened (often not the first step: clipping acts only once the gradient norm
    crosses its threshold), while data, modes, counters and the all-reduce itself agree.
    Where the ranks wrote differently into their gradients but the replicas never parted
    (a clip below its threshold so far, `clip_grad_norm_(..., inf)` to read the norm),
    it is a note, not an error.

    **Cause:** code between `loss.backward()` and `optimizer.step()` changes the averaged
    gradients on some ranks only: `clip_grad_norm_` inside an `if rank == 0:` logging
    block, a GradScaler whose `init_scale` comes from a per-node setting (each rank
    unscales the same averaged gradient by its own scale), a manual rescale under a
    rank branch, noise added to the averaged gradients from a generator seeded per rank.

    **Quick check:** right before `optimizer.step()`, print
    `torch.cat([p.grad.flatten() for p in model.parameters()]).norm()` on every rank,
    and once more right after `loss.backward()`: equal after backward, different
    before the step.

    **Fix:** run every change of the gradients between backward and the update on every
    rank alike: clip outside rank branches (log on rank 0, clip everywhere), build the
    GradScaler from one setting on every rank, scale by the world size everywhere; draw
    gradient noise from a generator seeded alike on every rank (or add it before the
    all-reduce).
    """

    code = "SD412"
    name = "gradients-changed-after-reduce"
    category = "optim.state_mismatch"
    stage = "grads_at_update"
    title = "The gradients changed between the all-reduce and the update on some ranks"

    def evaluate(self, ev: Evidence) -> Finding | None:
        changed = ev.reduce.changed_after_reduce
        if changed is None:
            return None
        split = agreement(changed.per_rank)
        # With no majority (two ranks), the side that changed what the all-reduce delivered,
        # where the others updated from it unchanged, is the side that ran the extra code.
        odd = split.odd if split.has_majority or not changed.changers else list(changed.changers)
        if changed.how == "writes":
            counts = ", ".join(f"{n} on rank {r}" for r, n in sorted(changed.per_rank.items()))
            evidence = [
                f"step {changed.step}: between the all-reduce (the update's last synchronised backward()) and "
                f"the update, the ranks wrote into their gradients in place a different number of times "
                f"({counts}): code that runs on some ranks only (clipping, unscaling, manual scaling)",
            ]
        else:
            groups: dict[int, list[int]] = {}
            for rank, fp in sorted(changed.per_rank.items()):
                groups.setdefault(fp, []).append(rank)
            if split.has_majority:
                sides = f"{fmt_ranks(odd)} apart from the others"
            elif len(groups) == len(changed.per_rank):
                sides = "no two ranks alike"
            else:
                sides = "split " + " | ".join(fmt_ranks(ranks) for ranks in groups.values())
            evidence = [
                f"step {changed.step}: every rank held the same gradient right after the all-reduce (grad_reduced_fp)",
                f"step {changed.step}: the ranks updated from different gradients (grad_fp: {sides}): code "
                "between backward() and the update (clipping, unscaling, manual scaling, a rank branch) changed them",
            ]
            if ev.differing("rng", "torch"):
                # (Python's and NumPy's generators differ per process unless seeded: no sign.)
                evidence.append(
                    "torch's default random generator differed across ranks when the probe attached "
                    "(seeded per rank): a random change between the all-reduce and the update "
                    "(gradient noise, random masking) draws differently on each rank"
                )
        if changed.changers and not split.has_majority:
            kept = [r for r in sorted(changed.per_rank) if r not in changed.changers]
            evidence.append(
                f"{fmt_ranks(list(changed.changers))} changed the gradients the all-reduce delivered; "
                f"{fmt_ranks(kept)} updated from them unchanged"
            )
        div = ev.replicas.divergence
        if div is not None:
            evidence.append(f"the replicas part at step {div.step}")
        elif changed.how == "writes":
            # Writes that changed no value (a clip that never bites, clip_grad_norm_(..., inf)
            # called to read the norm) leave the replicas equal: a risk, not yet a fault.
            evidence.append(
                "the replicas have not parted at any check: so far the writes changed no value "
                "(a clip below its threshold, or clip_grad_norm_ with max_norm=inf to read the norm)"
            )
            return self.found(0.5, evidence, ranks=odd, step=changed.step, severity="info")
        return self.found(0.9, evidence, ranks=odd, step=changed.step, direct=True)
