"""hparams: rank 0's optimizer param-group scalars and the loss object's public scalar attributes
forced on every rank before every optimizer step, through the job's store: rank 0 publishes
what it uses at its n-th step, the others wait (bounded) until it has reached it."""

from __future__ import annotations

import json
import sys
import time
from typing import Any

from syncdoctor.experiment.inrank.agree import agree, late, rank_world, variant_store, wait_s
from syncdoctor.experiment.inrank.run import POLL_S, RUN, note

_SCALARS = (bool, int, float, str)


def _scalar(value: Any) -> bool:
    if isinstance(value, _SCALARS):
        return True
    return isinstance(value, (tuple, list)) and 0 < len(value) <= 8 and all(isinstance(v, _SCALARS) for v in value)


def _loss_objects(probe: Any) -> tuple[list[tuple[str, Any]], str]:
    """The loss objects whose attributes are forced, and where they were found."""
    if probe.loss_fn is not None and hasattr(probe.loss_fn, "__dict__"):
        return [("loss_fn", probe.loss_fn)], f"{type(probe.loss_fn).__name__}, given to the probe"
    import torch

    main = sys.modules.get("__main__")
    found = []
    for name, value in sorted(vars(main).items() if main is not None else []):
        if isinstance(value, torch.nn.Module) and next(value.parameters(), None) is None and not name.startswith("_"):
            found.append((name, value))
    if not found:
        return [], "no loss object known (none given to the probe, no parameter-free module in __main__)"
    return found, "parameter-free modules of __main__: " + ", ".join(f"{n} ({type(v).__name__})" for n, v in found)


def _public_scalars(obj: Any) -> dict[str, Any]:
    return {k: v for k, v in sorted(vars(obj).items()) if not k.startswith("_") and k != "training" and _scalar(v)}


def _hparams_payload(optimizer: Any, losses: list[tuple[str, Any]]) -> str:
    groups = [{k: v for k, v in sorted(g.items()) if k != "params" and _scalar(v)} for g in optimizer.param_groups]
    return json.dumps({"groups": groups, "loss": {name: _public_scalars(obj) for name, obj in losses}})


def _same(current: Any, wanted: Any) -> bool:
    return (list(current) if isinstance(current, tuple) else current) == wanted


def _apply_hparams(optimizer: Any, losses: list[tuple[str, Any]], published: dict[str, Any]) -> int:
    """Set rank 0's values here; returns how many differed."""
    changed = 0
    for group, values in zip(optimizer.param_groups, published.get("groups", []), strict=False):
        for key, value in values.items():
            if key in group and _scalar(group[key]) and not _same(group[key], value):
                group[key] = tuple(value) if isinstance(group[key], tuple) else value
                changed += 1
    objects = dict(losses)
    for name, values in published.get("loss", {}).items():
        obj = objects.get(name)
        for key, value in values.items() if obj is not None else ():
            current = getattr(obj, key, None)
            if _scalar(current) and not _same(current, value):
                setattr(obj, key, tuple(value) if isinstance(current, tuple) else value)
                changed += 1
    return changed


def start(probe: Any, optimizer: Any) -> None:
    assert RUN.status is not None
    if RUN.hparams is not None:
        return  # a second optimizer: the first one is the one forced
    losses, source = _loss_objects(probe)
    payload = _hparams_payload(optimizer, losses)
    everyone = agree("hparams", payload)
    if everyone is None:
        RUN.status.fail(
            "no process group when the optimizer was bound" if rank_world() is None else late("the optimizer's binding")
        )
        return
    published = json.loads(everyone[0])
    changed = _apply_hparams(optimizer, losses, published)
    rank = rank_world()[0]  # type: ignore[index]
    RUN.hparams = {
        "optimizer": optimizer,
        "losses": losses,
        "rank": rank,
        "last": everyone[0],  # rank 0: what it published; the others: what they apply
        "published": published,
        "version": 0,
        "steps": 0,  # this rank's optimizer steps since the binding
        "wait_s": wait_s(),
    }
    keys = {k for g in published["groups"] for k in g}
    attrs = sorted({k for values in published["loss"].values() for k in values})
    RUN.status.changed = changed
    RUN.status.ok(
        f"rank 0's {len(keys)} optimizer settings and loss attributes ({', '.join(attrs) or 'none'}) forced "
        f"before every step; loss: {source}"
    )


def before_step(optimizer: Any) -> None:
    """Every step: rank 0 publishes what changed, then that it reached this step; the
    others wait for that (a rank after the backward's all-reduce is rarely more than a
    moment ahead of rank 0, but without the wait a value rank 0 changed between steps
    reached them one step late: the replicas parted for good, measured on an accelerate
    script that decays the lr on the main process only). A wait that runs out ends
    the waiting for the rest of the run, and says so (`_note`)."""
    hp = RUN.hparams
    if hp is None or hp["optimizer"] is not optimizer:
        return
    store = variant_store()
    hp["steps"] += 1
    try:
        if hp["rank"] == 0:
            payload = _hparams_payload(optimizer, hp["losses"])
            if payload != hp["last"]:
                store.set("hparams/latest", payload)
                store.add("hparams/version", 1)
                hp["last"] = payload
            store.add("hparams/steps", 1)  # after the payload: a rank that sees n sees step n's values
            return
        if hp["wait_s"]:
            deadline = time.monotonic() + hp["wait_s"]
            while store.add("hparams/steps", 0) < hp["steps"]:
                if time.monotonic() > deadline:
                    hp["wait_s"] = 0.0
                    note(
                        f"rank 0 had not reached optimizer step {hp['steps']} after {wait_s():.0f} s: "
                        "later steps take its latest values without waiting"
                    )
                    break
                time.sleep(POLL_S)
        version = store.add("hparams/version", 0)
        if version != hp["version"]:
            hp["published"] = json.loads(store.get("hparams/latest"))
            hp["version"] = version
        _apply_hparams(optimizer, hp["losses"], hp["published"])
    except Exception as exc:  # the store is gone (the job ends): stop forcing, say so
        RUN.hparams = None
        note(f"stopped forcing at a step: the store did not answer ({type(exc).__name__})")
