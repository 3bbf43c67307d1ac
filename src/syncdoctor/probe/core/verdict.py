"""What a probe says when the replicas part, whatever the framework: the verdict line
both probes print (and raise, and put in the evidence bundle), and the names of the
per-rank values a check compares. Framework-free: the torch probe (probe/torch/check.py)
and the MindSpore probe (probe/mindspore/probe.py) both use it, so a user sees one format.
"""

from __future__ import annotations

import sys

# The integers every rank posts at a check (counters, fingerprints, its train/eval
# modes), in the order of the gathered vector (probe/torch/check.py FIELDS begins with them).
COMPARED = (
    "step",
    "backward",
    "opt_steps",
    "micro",
    "param_fp",
    "opt_fp",
    "grad_fp",
    "buffer_fp",
    "data_fp",
    "config_fp",
    "mode",
)
# The per-rank values a check keeps in its record's `detail` (a list, one value per
# rank), in the order the evidence bundle shows them.
PER_RANK_DETAIL = ("grad_norm", "loss", *COMPARED)

# The log line names the most telling difference first.
LABEL = {
    "param": "parameter",
    "opt": "optimizer state",
    "grad": "reduced gradient",
    "buffer": "buffer",
    "counter": "step counter",
    "config": "optimizer/loss configuration",
    "mode": "train/eval mode",
    "data": "duplicate data",
}


_ORDER = ("param", "opt", "grad", "counter", "config", "mode", "buffer", "data")


def mismatch_message(step: int, what: list[str], ranks: list[int], tensor: str | None, world_size: int) -> str:
    """`GRADIENT_SYNC: rank 0 and rank 1 parameter mismatch at step 1200 (first: layer3.1.conv2.weight)`,
    then what else differs and the ranks outside the majority, or that there is none."""
    ordered = sorted(what, key=lambda w: _ORDER.index(w) if w in _ORDER else len(_ORDER))
    if ordered == ["data"] and len(ranks) >= 2:
        # Not a mismatch: these ranks read the very same batch.
        return (
            f"GRADIENT_SYNC: rank {ranks[0]} and rank {ranks[1]} consumed identical batches at step {step}; "
            f"ranks with duplicate data: {ranks}"
        )
    majority = [r for r in range(world_size) if r not in ranks]
    # A culprit only where a strict majority agrees; two ranks that disagree name both.
    named = len(ranks) * 2 < world_size and bool(ranks)
    if named:
        pair = f"rank {majority[0]} and rank {ranks[0]}"
    else:
        shown = ranks if ranks else list(range(world_size))
        pair = (
            f"rank {shown[0]} and rank {shown[1]}"
            if len(shown) == 2
            else "ranks " + ", ".join(map(str, shown[:8])) + (" …" if len(shown) > 8 else "")
        )
    where = f" (first: {tensor})" if tensor and ordered[0] in ("param", "grad") else ""
    message = f"GRADIENT_SYNC: {pair} {LABEL[ordered[0]]} mismatch at step {step}{where}"
    if len(ordered) > 1:
        message += "; also differ: " + ", ".join(LABEL[w] for w in ordered[1:])
    if named:
        return message + f"; odd one out: {ranks} (the other {len(majority)} ranks agree)"
    return message + "; no majority to tell which side is odd (a third replica or a recomputation would)"


def print_verdict(message: str) -> None:
    """The verdict line on stderr, as both probes print it."""
    print(f"syncdoctor: [ERROR] {message}", file=sys.stderr, flush=True)
