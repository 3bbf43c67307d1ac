"""Healing a replica that silent corruption changed (on_mismatch="heal", opt-in).

Data parallelism keeps one copy of the model per rank, and healthy copies are
bitwise equal. When one rank's copy parts from the others while everything that a
bug would change agrees — step counters, the optimizer/loss configuration, train/eval
modes, the data — and the copies agreed at the check before, the likeliest cause is
a flipped bit on that rank's chip. With three or more ranks a strict majority says
which copy is the odd one; this module then restores it from a majority rank:
parameters, buffers and optimizer state, over the job's own process group.

It never heals what looks like a bug: a counter, configuration, mode or data
difference, replicas that differed from the first check (initialisation), copies
that part again at the first check after a heal (a persistent fault: a transient
flip is not followed by another within K steps but by chance), two ranks or a split
without a majority. Those stay what on_mismatch="warn" makes them: a line and a
record, and the refusal is recorded with its reason.

Protocol. Checks are compared by one rank at a time, through the job's c10d store,
without collectives (check.py), so a verdict reaches the other ranks at different
moments. A heal is a collective: every rank must take part at the same step or the
job hangs. Under "heal" (and only there) every check is therefore decided together,
at the check step itself (after_post):

1. Each rank posts its block of checks as under "warn", then counts itself in; the
   last to arrive marks the block as posted by all. The block's reader waits for
   that mark (at most HEAL_POST_WAIT_S: ranks in lockstep post within the step's
   skew, and the reader would wait for them at the next step's collective anyway),
   reads and compares the block, and writes its decision with compare_set: "ok", or
   a plan (restore the odd ranks from rank `source`). The others wait for the
   decision, and past twice that time write "late" the same way. compare_set keeps
   the first value written, so every rank acts on the same one.
2. On a plan, every rank heals right there, before the next step: the corrupted copy
   takes no further step, and feeds no gradient into the others' updates. A flip
   between two checks therefore changes the job for at most K steps.
3. On "late" (a rank or the store slow) the block is read at the reader's next
   check, as under "warn"; a heal it finds is published in the store for the next
   check step S. Every rank asks the store at each check step, before its
   fingerprints, whether a plan is new (one round trip). Data-parallel ranks run in
   lockstep — each step holds a collective the reader joins after publishing — so
   every rank has seen the plan by its check step S at the latest.
4. To heal, every rank that knows the plan posts its parameters' fingerprint and
   counts itself in. The one that completes the count writes, with compare_set,
   "go" if the copies still split as planned (else "stale": a plan made a check ago
   may be overtaken, e.g. by a NaN that reached every rank); a rank that waits
   longer than HEAL_WAIT_S writes "abort" the same way: all broadcast, or none
   does. A rank that never learned of the plan only delays the others by
   HEAL_WAIT_S.
"""

from __future__ import annotations

import json
import math
import os
import socket
import sys
import time
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.distributed as dist

from syncdoctor import settings
from syncdoctor.records import contract
from syncdoctor.records.compare import agreement

if TYPE_CHECKING:
    from syncdoctor.probe.torch.check import CrossRankCheck

# Under "heal" a block of checks is read at least this often (steps), so that a
# corrupted copy trains on for a few steps, not hundreds: one store write per rank
# and block, still no per-step work (at the lab's K = 10 and the default K = 50: every
# check is its own block).
HEAL_READ_EVERY_STEPS = 10
# The reader of a block waits at most this long, at the check that fills it, for the
# other ranks to post it too; past that it reads it at its next check as under "warn".
# Lockstep ranks post within the step's skew, and the reader would wait for them at the
# next step's collective anyway, so the wait costs a few store round trips, not time.
HEAL_POST_WAIT_S = 1.0
HEAL_WAIT_S = 30.0  # the longest the ranks wait for each other at the heal step (env SYNCDOCTOR_HEAL_WAIT_S)
POLL_S = 0.002
BUCKET_BYTES = 32 << 20  # tensors travel flattened in buckets of about this size
HEALABLE = {"param", "opt", "grad", "buffer"}  # what corruption changes; anything else is a bug's mark
STATE_FIELDS = ("param_fp", "opt_fp", "grad_fp", "buffer_fp")


def block_for(check_every: int) -> int:
    """Checks per block under "heal"."""
    return max(1, math.ceil(HEAL_READ_EVERY_STEPS / check_every))


class Healer:
    """One rank's part in healing; created by CrossRankCheck under on_mismatch="heal"."""

    def __init__(self, checker: CrossRankCheck) -> None:
        self.checker = checker
        self.probe = checker.probe
        self.store = checker.store
        self.world_size = checker.world_size
        self.seen = 0  # plans read from the store
        self.plan: dict[str, Any] | None = None  # the plan this rank will act on
        self.healed_through = 0  # the step of the last heal
        self.healed_after = 0  # the check a heal followed at once (after_post): the next check sees the healed state
        self.refusals: set[str] = set()
        self.host = socket.gethostname()
        self.wait_s = float(os.environ.get(settings.HEAL_WAIT_ENV) or HEAL_WAIT_S)
        self.post_wait_s = min(HEAL_POST_WAIT_S, self.wait_s)
        self.deciding = False  # reading a block at the check that posted it (after_post)
        self.candidate: dict[str, Any] | None = None  # the heal that read would plan

    # ------------------------------------------------------------------ the reader's side
    def after_block(self, first: int, blocks: list[np.ndarray]) -> None:
        """A block with a mismatch was read: find an onset (a check that differs where
        the one before agreed) and decide whether it is healable."""
        from syncdoctor.probe.core.compare import FIELDS, WIDTH, compare

        checks = min(len(rows) for rows in blocks)
        agreed_before: bool | None = None
        for n in range(checks):
            if first + n - 1 == self.healed_after:
                agreed_before = True  # healed right after the check before: the copies were equal from there
            table = [[int(v) for v in rows[n][1 : 1 + WIDTH]] for rows in blocks]
            what, _ = compare(table, self.checker.buffers_must_match)
            if not what:
                agreed_before = True
                continue
            if not set(what) & HEALABLE:  # the replicas' state agrees: nothing to heal
                agreed_before = False
                continue
            if agreed_before is None:
                agreed_before = self._previous_check_agreed(first)
            step = table[self.checker.rank][FIELDS.index("step")]
            if first + n == 1:
                self._refuse(
                    "the replicas differ from the first check: initialisation or set-up, not corruption", step, what
                )
            elif agreed_before and self.healed_through and step <= self.healed_through + self.probe.check_every:
                self._refuse(
                    "the replicas part again right after a heal: a persistent fault, not a transient corruption",
                    step,
                    what,
                )
            elif agreed_before and step > self.healed_through:
                self._consider(first + n, step, table, what)
            agreed_before = False

    def _previous_check_agreed(self, first: int) -> bool:
        """Whether every rank agreed at check `first - 1`, the last of the previous
        block (still in the store's ring of slots)."""
        from syncdoctor.probe.core.compare import WIDTH, compare, rows_of

        if first <= 1:
            return False
        number = (first - 2) // self.checker.block + 1
        keys = [self.checker._key(number, r) for r in range(self.world_size)]
        if not self.store.check(keys):
            return False
        blocks = [rows_of(v) for v in self.store.multi_get(keys)]
        table: list[list[int]] = []
        for rows in blocks:
            at: np.ndarray | list[int] = np.flatnonzero(rows[:, 0] == first - 1) if len(rows) else []
            if not len(at):
                return False  # the slot was reused: unknown, so not healable
            table.append([int(v) for v in rows[at[0], 1 : 1 + WIDTH]])
        what, _ = compare(table, self.checker.buffers_must_match)
        return not what

    def _consider(self, index: int, step: int, table: list[list[int]], what: list[str]) -> None:
        from syncdoctor.probe.core.compare import FIELDS

        bug = [w for w in what if w not in HEALABLE]
        if bug:
            self._refuse(f"{', '.join(bug)} differ(s) too: the mark of a bug, not of corruption", step, what)
            return
        layout = self.checker.layout
        if (layout is not None and layout.sharded) or not self.probe.opt_state_replicated:
            self._refuse(
                "the ranks hold parts of the model (sharded), not copies of it: nothing to restore from", step, what
            )
            return
        if self.world_size < 3:
            self._refuse(
                "two replicas: nothing says which one is corrupted (a third replica or a "
                "recomputation of the step would)",
                step,
                what,
            )
            return
        columns = [FIELDS.index(f) for f in STATE_FIELDS]
        split = agreement({r: tuple(row[c] for c in columns) for r, row in enumerate(table)})
        if not split.has_majority or not split.odd:
            self._refuse("no strict majority of replicas agrees", step, what)
            return
        if self.plan is not None:
            return  # a heal is under way
        plan = {
            "source": split.majority[0],
            "odd": split.odd,
            "check": index,
            "check_step": step,
            "what": what,
            "reader": self.checker.rank,
        }
        if self.deciding:  # read at the check that posted it: every rank is waiting for the decision
            self.candidate = self.candidate or plan
        else:
            self._publish(plan)

    def _publish(self, plan: dict[str, Any]) -> None:
        """Plan a heal at the next check step, for the ranks to learn of at their checks."""
        now = self.probe.step
        every = self.probe.check_every
        # Counted first (the answer is awaited), written next: a rank that sees the count
        # before the plan arrives waits for it in get().
        self.seen = self.store.add("heal/plans", 1)
        plan = {**plan, "id": self.seen, "published_at": now, "step": every * (now // every + 1)}
        self.store.set(f"heal/{self.seen}", json.dumps(plan))
        self.plan = plan

    def _refuse(self, reason: str, step: int, what: list[str]) -> None:
        if reason in self.refusals:
            return
        self.refusals.add(reason)
        print(
            f"syncdoctor: rank {self.checker.rank}: mismatch at step {step} not healed: {reason}",
            file=sys.stderr,
            flush=True,
        )
        self._record(
            self.probe.step, f"not healed: {reason}", status="refused", check_step=step, what=what, reason=reason
        )

    def _record(self, step: int, message: str, **heal: Any) -> None:
        """The heal event: what was decided (heal["status"]) and why, in words and fields."""
        self.probe.writer.write(
            contract.KIND_EVENT,
            rank=self.checker.rank,
            t=time.time(),
            step=step,
            event="heal",
            message=message,
            heal=heal,
        )

    # ------------------------------------------------------------------ every rank, at a block's post
    def after_post(self) -> None:
        """Right after every rank posted block n (its last check is this step): decide
        now, together, whether to heal, and heal before the next step, so that a
        corrupted copy takes no further step and feeds no gradient into the others'.

        Each rank counts itself in; the last one sets `all`. The block's reader waits for
        `all` (at most HEAL_POST_WAIT_S), reads the block, and writes its decision with
        compare_set: "ok", or a plan. The others wait for it (twice as long) and, past
        that, write "late" the same way. compare_set keeps the first value, so every rank
        acts on the same one: all heal now, or none does (after "late" the block is read
        at the next check as under "warn", and a plan is published for the check after)."""
        checker = self.checker
        layout = checker.layout
        if (
            checker.stopped
            or self.world_size < 3
            or (layout is not None and layout.sharded)
            or not self.probe.opt_state_replicated
        ):
            return  # nothing could be healed: the checks are read as under "warn" (and refusals recorded)
        number = (checker.count - 1) // checker.block + 1
        key = f"heal/b{number}"
        if self.store.add(f"{key}/n", 1) == self.world_size:
            self.store.set(f"{key}/all", "1")
        reads = bool(checker.due) and checker.due[-1][0] == number
        value = "late"
        self.candidate = None
        if reads:
            try:
                self.store.wait([f"{key}/all"], timedelta(seconds=self.post_wait_s))
                posted = True
            except Exception:  # not every rank posted in time (a store that is gone fails below too)
                posted = False
            if posted:
                self.deciding = True
                try:
                    checker._read_due(checker.count)
                finally:
                    self.deciding = False
                value = json.dumps(self.candidate) if self.candidate else "ok"
        else:
            try:
                self.store.wait([f"{key}/v"], timedelta(seconds=2 * self.post_wait_s))
            except Exception:
                pass
        decision = self.store.compare_set(f"{key}/v", "", value).decode()
        if reads and self.candidate and decision != value:
            self._publish(self.candidate)  # the others went on: heal at the next check instead
        if decision.startswith("{"):
            step = self.probe.step
            plan = {**json.loads(decision), "id": f"b{number}", "published_at": step, "step": step}
            self.healed_through = step
            if self._meet_and_heal(plan, step):
                self.healed_after = checker.count

    # ------------------------------------------------------------------ every rank
    def at_check(self, step: int) -> None:
        """At each check step: learn of a new plan; at its step, meet the others and heal."""
        plans = self.store.add("heal/plans", 0)
        if plans > self.seen:
            self.seen = plans
            plan = json.loads(self.store.get(f"heal/{plans}"))
            self.plan = plan if step <= plan["step"] else None
        if self.plan is None:
            return
        if step > self.plan["step"]:
            self.plan = None  # missed (a rank ahead of its peers): the others abort after HEAL_WAIT_S
        elif step == self.plan["step"]:
            plan, self.plan = self.plan, None
            self.healed_through = step
            self._meet_and_heal(plan, step)  # before this check's fingerprints: they see the healed copies

    def _meet_and_heal(self, plan: dict[str, Any], step: int) -> bool:
        """Meet the other ranks at `step` and heal if every one came; True if it healed."""
        from syncdoctor.probe.core.fingerprint import combine
        from syncdoctor.probe.torch.fingerprint import fingerprints

        key = f"heal/{plan['id']}"
        state_key = f"{key}/state"
        # Each rank posts its parameters' fingerprint as it arrives; the last to arrive
        # decides whether the copies still split as planned (the source in the majority,
        # the odd ranks still odd): a plan made checks ago may be stale.
        own = combine(fingerprints(p for _, p in self.probe._named_params))
        self.store.set(f"{key}/fp/{self.checker.rank}", str(own))
        if self.store.add(f"{key}/arrived", 1) == self.world_size:
            values = self.store.multi_get([f"{key}/fp/{r}" for r in range(self.world_size)])
            split = agreement({r: v for r, v in enumerate(values)})
            still = split.has_majority and plan["source"] in split.majority and split.odd == plan["odd"]
            self.store.compare_set(state_key, "", "go" if still else "stale")
        deadline = time.monotonic() + self.wait_s
        while not self.store.check([state_key]):
            if time.monotonic() > deadline:
                self.store.compare_set(state_key, "", "abort")
                break
            time.sleep(POLL_S)
        decision = self.store.get(state_key).decode()
        rank = self.checker.rank
        info = {k: plan[k] for k in ("id", "source", "odd", "check_step", "what")}
        if decision != "go":
            why = (
                "the copies no longer split as planned (all equal again, or another split)"
                if decision == "stale"
                else f"not every rank reached step {step} in time"
            )
            message = f"heal of rank(s) {plan['odd']} aborted: {why}"
            print(f"syncdoctor: rank {rank}: {message}", file=sys.stderr, flush=True)
            self._record(step, message, **info, status="aborted", reason=why)
            return False
        t0 = time.perf_counter()
        sent = restore_from(plan["source"], self.probe.module, self.probe.optimizer, self.probe._named_params)
        seconds = time.perf_counter() - t0
        host = self.host
        message = (
            f"healed rank(s) {plan['odd']} from rank {plan['source']} at step {step} "
            f"(copies parted at the check of step {plan['check_step']}: {', '.join(plan['what'])}); "
            f"{sent} bytes in {seconds * 1e3:.1f} ms"
        )
        if rank in plan["odd"] or rank == 0:
            print(f"syncdoctor: rank {rank} ({host}): {message}", file=sys.stderr, flush=True)
        self._record(step, message, **info, status="healed", bytes=sent, seconds=round(seconds, 6), host=host)
        return True


def state_tensors(
    module: torch.nn.Module, optimizer: torch.optim.Optimizer | None, named_params: list[tuple[str, torch.Tensor]]
) -> list[torch.Tensor]:
    """Everything a replica holds, in an order every rank agrees on: parameters,
    buffers, then the optimizer state of each parameter (keys sorted)."""
    tensors = [p.detach() for p in module.parameters()]
    tensors += [b for b in module.buffers()]
    if optimizer is not None:
        for _, p in named_params:
            state = optimizer.state.get(p, {})
            tensors += [state[k] for k in sorted(state, key=str) if isinstance(state[k], torch.Tensor)]
    return tensors


@torch.no_grad()
def restore_from(
    source: int,
    module: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None,
    named_params: list[tuple[str, torch.Tensor]],
    group: Any = None,
) -> int:
    """Broadcast every tensor of the replica from rank `source` (every rank calls
    this at the same point); returns the bytes broadcast."""
    return broadcast_tensors(state_tensors(module, optimizer, named_params), source, group)


@torch.no_grad()
def broadcast_tensors(tensors: list[torch.Tensor], source: int, group: Any = None) -> int:
    """Broadcast `tensors` in place from `source`, flattened into buckets of one
    device and dtype (one collective per bucket, not per tensor)."""
    backend = dist.get_backend(group)
    device = torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else None
    buckets: dict[tuple[Any, ...], list[torch.Tensor]] = {}
    sent = 0
    for tensor in tensors:
        key = (tensor.device, tensor.dtype)
        bucket = buckets.setdefault(key, [])
        bucket.append(tensor)
        if sum(t.numel() * t.element_size() for t in bucket) >= BUCKET_BYTES:
            sent += _broadcast_bucket(buckets.pop(key), source, group, device)
    for bucket in buckets.values():
        sent += _broadcast_bucket(bucket, source, group, device)
    return sent


def _broadcast_bucket(bucket: list[torch.Tensor], source: int, group: Any, device: torch.device | None) -> int:
    flat = torch.cat([t.reshape(-1) for t in bucket])
    if device is not None and flat.device.type == "cpu":
        flat = flat.to(device)  # NCCL moves device memory only (e.g. Adam's step counters live on the CPU)
    dist.broadcast(flat, source, group=group)
    if dist.get_rank() != source:
        offset = 0
        for t in bucket:
            t.copy_(flat[offset : offset + t.numel()].view_as(t))
            offset += t.numel()
    return flat.numel() * flat.element_size()
