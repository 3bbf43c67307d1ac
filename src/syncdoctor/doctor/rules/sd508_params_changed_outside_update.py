from __future__ import annotations

import polars as pl

from syncdoctor.doctor.evidence import Evidence, int_of
from syncdoctor.doctor.evidence.replicas import confined
from syncdoctor.doctor.model import Finding
from syncdoctor.doctor.rules.base import Rule
from syncdoctor.rulebook import fmt_ranks

# What a difference in the update's inputs, the data or the set-up looks like: another cause.
NOT_OUTSIDE = {"grad", "counter", "config", "mode", "data"}


class ParamsChangedOutsideUpdate(Rule):
    """The replicas part while everything the update reads agrees: code outside the
    update changed the weights on some ranks, by writes torch does not count.

    **Symptom:** no error; the replicas part between two checks, in most tensors at
    once, while the reduced gradients, the optimizer state, its hyperparameters and the
    step counters agree on every rank, and the parameters' in-place write counts agree
    too. Often right after an evaluation, an export or a checkpoint that rank 0 alone
    runs.

    **Cause:** the same inputs give every replica the same update, so the weights were
    changed outside it: EMA or SWA weights swapped in for a rank-0 evaluation and never
    restored (a backup that aliases the live tensor, `backup = p.data`, instead of a
    clone), a checkpoint loaded into the training model on one rank, weights edited
    through `p.data` (a detached view whose writes torch's version counters do not
    count, so the per-rank write counts stay equal).

    **Quick check:** hash the parameters on every rank right before and right after
    the evaluation/checkpoint block: they change on rank 0 only.

    **Fix:** evaluate or export a copy (`copy.deepcopy(model.module)`, an EMA model of
    its own), clone what you back up (`p.detach().clone()`), and restore before
    training resumes; change the training weights only on every rank alike, or
    broadcast them from rank 0 afterwards.
    """

    code = "SD508"
    name = "params-changed-outside-update"
    category = "model.init_mismatch"
    stage = "params"
    title = "The weights changed outside the update: the update's inputs agree, the replicas do not"

    def evaluate(self, ev: Evidence) -> Finding | None:
        div = ev.replicas.divergence
        if not ev.has_records or div is None or "param" not in div.what or NOT_OUTSIDE & set(div.what):
            return None
        if div.step <= int_of(ev.steps["step"].min()):
            return None  # apart from the first check: the start (SD501, SD506)
        if any(e["heal"].get("status") == "healed" for e in ev.events.heals):
            return None  # a heal writes the majority's weights into the odd rank
        if ev.events.rebuilt_within(div.last_agree_step, div.step) is not None:
            return None  # state loaded into a rebuilt model (SD505)
        reach = ev.replicas.tensors_parted(div.step)
        if reach is None or confined(reach):
            return None  # a change confined to few tensors: a flipped value's mark (SD971)
        replicas = ev.replicas
        checked = replicas.fingerprints.first_measured("opt", div.step)
        if checked is None or replicas.agree_after("grad", div.step) is not True:
            return None
        if replicas.agree_after("opt", div.step) is not True:
            return None  # the optimizer state differs: the update itself differs (SD601)
        if self._writes_differ(ev, checked):
            return None  # the counted writes differ: SD507 names them
        drift = ev.settings.hyperparameter_drift
        if ev.differing("optimizer", "param_groups") or (drift is not None and drift[0] <= checked):
            return None  # a learning rate or a hyperparameter apart: the updates differed (SD601)
        evidence = [
            f"{fmt_ranks(div.ranks)} part at step {div.step}"
            + (f" (equal at the check of step {div.last_agree_step})" if div.last_agree_step else "")
            + f": {reach[0]} of {reach[1]} tensors differ"
            + (f", first {div.tensor}" if div.tensor else ""),
            f"at the check of step {checked} every input of the update agreed on every rank: the reduced "
            "gradients (grad_fp), the optimizer state (opt_fp), its hyperparameters (config_fp, and the "
            "learning rate at every step recorded) and the step counters; "
            "with the same inputs the update changes every replica alike, so the weights were changed "
            "outside it",
            "the parameters' in-place write counts agree: the change went through writes torch does not "
            "count (p.data, a copy into a detached view) or loaded tensors",
        ]
        direct = checked == div.step
        if not direct:
            evidence.append(
                f"the update's inputs were not fingerprinted between steps {div.last_agree_step or 1} and "
                f"{checked}: a reduction skipped once in between would leave the same picture; "
                "`syncdoctor run --check-every 1` separates the two"
            )
        return self.found(0.9 if direct else 0.8, evidence, ranks=div.ranks, step=div.step, tensor=div.tensor)

    @staticmethod
    def _writes_differ(ev: Evidence, step: int) -> bool:
        if "param_writes" not in ev.steps.columns:
            return False
        rows = ev.steps.filter((pl.col("step") <= step) & pl.col("param_writes").is_not_null())
        per_step = rows.group_by("step").agg(pl.col("param_writes").n_unique().alias("k"))
        return bool(per_step.height) and int_of(per_step["k"].max()) > 1
