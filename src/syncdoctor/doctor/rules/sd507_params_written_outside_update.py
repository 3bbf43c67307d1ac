from __future__ import annotations

import polars as pl

from syncdoctor.doctor.evidence import Evidence
from syncdoctor.doctor.model import Finding
from syncdoctor.doctor.rules.base import Rule
from syncdoctor.records.compare import agreement
from syncdoctor.rulebook import fmt_ranks


class ParamsWrittenOutsideUpdate(Rule):
    """Code outside the optimizer's update wrote into the parameters on some ranks only.

    **Symptom:** the replicas part between two checks, on one rank (or a few), while
    the gradients, the optimizer's settings and the step counters agree; often at a
    round step, where the script checkpoints, exports or evaluates.

    **Cause:** an in-place change of the live parameters under a rank branch: a pruned
    or quantised export made from the model itself instead of a copy, weights clamped
    or re-initialised on the main process, a checkpoint or EMA weights loaded into the
    training model on rank 0 only. The update writes into the parameters alike on every
    rank; torch counts every in-place write (a tensor's version counter), and the
    probe records the count at each check: here it differs across ranks.

    **Quick check:** print `sum(p._version for p in model.parameters())` on every rank
    before and after the suspect block.

    **Fix:** work on a copy (`copy.deepcopy(model.module)` or the state_dict's
    tensors cloned) for anything rank 0 exports or evaluates; change the training
    weights only on every rank alike, or broadcast them from rank 0 afterwards.
    """

    code = "SD507"
    name = "params-written-outside-update"
    category = "model.init_mismatch"
    stage = "params"
    title = "Parameters written outside the update on some ranks"

    def evaluate(self, ev: Evidence) -> Finding | None:
        div = ev.replicas.divergence
        if not ev.has_records or "param_writes" not in ev.steps.columns or div is None or "param" not in div.what:
            return None
        if any(e["heal"].get("status") == "healed" for e in ev.events.heals):
            return None  # a heal writes the majority's weights into the odd rank: its own writes
        apart = ev.reduce.gradients_apart
        if apart is not None and apart.step <= div.step:
            return None  # the optimizer skips a parameter without a gradient: fewer writes, by the update (SD410)
        rows = (
            ev.steps.filter(pl.col("param_writes").is_not_null())
            .sort("rank", "step")
            .with_columns(
                (pl.col("param_writes") - pl.col("param_writes").shift().over("rank")).alias("writes"),
                pl.col("step").shift().over("rank").alias("since"),
                (pl.col("opt_steps") - pl.col("opt_steps").shift().over("rank")).alias("updates"),
            )
            .filter(pl.col("writes").is_not_null())
        )
        parted = (
            rows.group_by("step")
            .agg(
                pl.col("writes").n_unique().alias("k"),
                pl.col("updates").n_unique().alias("u"),
                pl.len().alias("n"),
                pl.col("since").min(),
            )
            # Ranks that made different numbers of updates wrote differently by the update
            # itself (a skipped or an extra step: their own rules).
            .filter((pl.col("k") > 1) & (pl.col("u") == 1) & (pl.col("n") == len(ev.ranks)))
            .sort("step")
        )
        for step, since in parted.select("step", "since").iter_rows():
            if ev.events.rebuilt_within(since - 1, step + 1) is not None:
                continue  # a rebuilt model's parameters are new tensors: their counts restart
            if div.step < since:
                return None  # the replicas had parted already: these writes came after
            at = rows.filter(pl.col("step") == step)
            writes = {int(r): int(w) for r, w in zip(at["rank"], at["writes"], strict=True)}
            split = agreement(writes)
            if split.has_majority:
                odd, usual = split.odd, int(split.reference)
            else:  # no majority (two ranks): the extra writes are the ranks with the most
                odd, usual = [r for r, w in writes.items() if w == max(writes.values())], min(writes.values())
            evidence = [
                f"between the checks at steps {since} and {step}, {fmt_ranks(odd)} wrote into the parameters in "
                f"place {', '.join(str(writes[r]) for r in odd)} times against {usual} on the other ranks: code "
                "outside the optimizer's update changed them (an export, a clamp or a load under a rank branch)",
                f"the replicas part at step {div.step}" + (f", first at {div.tensor}" if div.tensor else ""),
            ]
            return self.found(0.9, evidence, ranks=sorted(odd), step=step, tensor=div.tensor, direct=True)
        return None
