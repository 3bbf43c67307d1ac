"""The live cross-rank check.

Every check step each rank adds one small row (the check's index, counters,
fingerprints, and the parameters' fingerprints in at most TENSOR_GROUPS groups) to a
block; a full block goes to the job's own key-value store, the c10d store that every
process group rendezvoused through, in one `set` that waits for no reply. The ranks
take turns to read a block back (block b: rank (b - 1) mod N; every rank under
on_mismatch="raise", so that all of them stop at the same check), in one round trip,
a few checks after its last one. The reader compares every check of it, writes the
result and publishes a mismatch as a verdict the other ranks pick up.

Why the store and not a collective: on this 2-core machine an asynchronous all_gather
on a side gloo group cost 8-12% of a 3.5 ms step even every 10 steps (its threads wake
and take a core from training), a store round trip about 60 us. And a store exchange
cannot deadlock: nothing pairs. The d-th check of every rank is compared with the d-th
of the others, so ranks out of step show as a counter mismatch; a rank that never
posts shows, after a bounded wait, as a check that could not complete, naming it.
"""

from __future__ import annotations

import itertools
import json
import math
import sys
import time
import zlib
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import numpy as np
import torch.distributed as dist

from syncdoctor import settings
from syncdoctor.probe.core.compare import (
    CLASS_FIELDS,
    FIELDS,
    MUST_MATCH,
    N_CLASS_COLUMNS,
    N_INT,
    WIDTH,
    bits_float,
    compare_groups,
    float_bits,
    group_bounds,
    groups_agree,
    rows_of,
    tensor_groups,
)
from syncdoctor.probe.core.mesh import MAX_CLASSES
from syncdoctor.probe.core.verdict import mismatch_message, print_verdict
from syncdoctor.records import contract

if TYPE_CHECKING:
    from syncdoctor.probe.torch.heal import Healer
    from syncdoctor.probe.torch.probe import Probe

_INT_FIELDS = FIELDS[:N_INT]
MIN_SLACK_STEPS = 4
SyncMismatchError = settings.SyncMismatchError  # one type for both probes (syncdoctor/settings.py)


READ_EVERY_STEPS = 100  # a block holds the checks of up to this many steps: one write, one read
MAX_BLOCK = 50  # and at most this many checks: what one read holds stays small at K = 1
MAX_ROWS_PER_READ = 4096  # checks of all ranks one read moves, at most (each 16 + TENSOR_GROUPS int64)
STORE_TIMEOUT_S = 10.0  # the most one store call may take before checks stop
CLOSE_POLL_S = 0.01  # at close, the shortest pause between two looks at the store
VERDICT_POLL_S = 1.0  # how often a rank asks whether a reader found a mismatch
_instances = itertools.count()  # probes created in this process, in order: the same on every rank


def job_store(timeout_s: float) -> Any:
    """The job's c10d store, on a connection of our own whose every call is bounded
    by `timeout_s` (the job's own timeout, often 30 minutes, stays as it is)."""
    store = dist.distributed_c10d._get_default_store()
    try:
        store = store.clone()  # type: ignore[attr-defined, unused-ignore]  # in torch>=2.14's stubs only
        store.set_timeout(timedelta(seconds=timeout_s))
    except Exception:
        pass  # an older torch: the job's own store timeout bounds every call
    return store


class CrossRankCheck:
    def __init__(self, probe: Probe, timeout_s: float) -> None:
        self.probe = probe
        self.rank = probe.rank
        self.timeout_s = timeout_s
        self.world_size = probe.world_size
        self.store = dist.PrefixStore(f"syncdoctor/{next(_instances)}", job_store(min(timeout_s, STORE_TIMEOUT_S)))
        # Checks travel in blocks of `block` consecutive ones (one store write per rank
        # and block), and each block is read by one rank, in turn (by every rank under
        # "raise", so that all of them stop at the same check): one round trip. A block
        # is read `lag` checks after its last one, and at least MIN_SLACK_STEPS steps
        # later, when every rank has long posted it. Every check is still compared; only
        # the verdict comes later.
        self.block = max(
            1, min(math.ceil(READ_EVERY_STEPS / probe.check_every), MAX_BLOCK, MAX_ROWS_PER_READ // self.world_size)
        )
        self.healer: Healer | None = None
        if probe.on_mismatch == "heal":  # verdicts sooner: the corrupted copy trains on until healed
            # Imported only here: every rank would pay its import at start-up otherwise.
            from syncdoctor.probe.torch.heal import Healer, block_for

            self.block = min(self.block, block_for(probe.check_every))
            self.healer = Healer(self)
        self.lag = max(1, math.ceil(MIN_SLACK_STEPS / probe.check_every))
        self.ring = 3 + math.ceil(self.lag / self.block)  # store slots per rank, reused in turn
        self.everyone_reads = probe.on_mismatch == "raise"
        self.count = 0  # checks submitted
        self.rows: list[list[int]] = []  # this rank's checks of the block being filled
        self.due: list[tuple[int, float]] = []  # blocks this rank reads: (number, posted at)
        self.ready_slots: set[int] = set()  # slots every rank has written: multi_get cannot wait
        self.stopped = False
        self.store_failed = False  # the store itself did not answer: nothing more is asked of it
        self.reported: set[tuple[str, ...]] = set()
        self.verdicts_seen = 0
        self.polled_at = time.monotonic()
        self.pending_error: SyncMismatchError | None = None
        # Buffers are compared only where they must match: at forward start under DDP
        # with broadcast_buffers (just broadcast from rank 0). Otherwise a difference is
        # recorded as detail["buffers_differ_unsynced"], not as a mismatch: nothing
        # promised to keep them equal (the doctor judges whether that matters).
        self.buffers_must_match = bool(
            getattr(probe.model, "broadcast_buffers", False) and probe.module is not probe.model
        )
        self._must_columns = [1 + FIELDS.index(f) for f in MUST_MATCH] + (
            [1 + FIELDS.index("buffer_fp")] if self.buffers_must_match else []
        )
        self.layout = probe.layout
        self._modes: dict[Any, int] = {}  # train_mode -> its crc32, as posted

    def _key(self, block: int, rank: int) -> str:
        return f"{block % self.ring}/{rank}"

    def submit(self, record: dict[str, Any]) -> None:
        """Add this rank's next check; post the block when it is full, and read the
        blocks that are this rank's turn."""
        if self.stopped:
            return
        self.count += 1
        get = record.get
        train_mode = get("train_mode")
        mode = self._modes.get(train_mode)
        if mode is None:
            if len(self._modes) > 64:  # modules switched in many patterns: stays small
                self._modes.clear()
            # Not hash(): str hashes are salted per process.
            mode = self._modes[train_mode] = zlib.crc32(str(train_mode).encode())
        values = [self.count, *[get(f) or 0 for f in _INT_FIELDS]]
        values += (mode, float_bits(get("loss")), float_bits(get("grad_norm")))
        values += self._class_section(record)
        values.append(self._data_key())
        values += tensor_groups(self.probe.last_tensor_fps)
        self.rows.append(values)
        try:
            if len(self.rows) == self.block:
                self._post()
                if self.healer is not None:  # "heal": decide at this check, heal before the next step
                    self.healer.after_post()
            self._read_due(self.count - self.lag)
            if not self.everyone_reads and time.monotonic() - self.polled_at >= VERDICT_POLL_S:
                self._poll_verdicts()
        except Exception as exc:  # the store is gone (its host died) or does not answer
            self._give_up(record["step"], exc)

    def _class_section(self, record: dict[str, Any]) -> list[int]:
        layout = self.layout
        if layout is None or not layout.sharded:
            out = [1, record.get("param_fp") or 0, record.get("opt_fp") or 0, record.get("grad_fp") or 0]
        else:
            classes = record.get("replica_fps") or {}
            out = []
            for c, key in enumerate(layout.keys):
                out += [key, *((classes.get(k) or [0] * MAX_CLASSES)[c] or 0 for k in ("param", "opt", "grad"))]
        if not self.probe.opt_state_replicated:  # ZeRO: each rank holds its own part of the state
            out[2 :: len(CLASS_FIELDS)] = [0] * len(out[2 :: len(CLASS_FIELDS)])
        return out + [0] * (N_CLASS_COLUMNS - len(out))

    def _data_key(self) -> int:
        layout = self.layout
        return layout.data_key if layout is not None and layout.data_key is not None else self.rank + 1

    def heal_due(self, step: int) -> None:
        """At a check step, before its fingerprints: learn of a heal plan, and at its
        step take part in the heal (heal.py)."""
        if self.stopped or self.healer is None or self.world_size < 3:
            return
        try:
            self.healer.at_check(step)
        except Exception as exc:  # the store is gone: the others abort the heal after a bounded wait
            self._give_up(step, exc)

    def _post(self) -> None:
        """One store write for the block (sent without waiting for a reply): its number
        of rows, their length, the rows (int64)."""
        number = (self.count - 1) // self.block + 1
        self.store.set(
            self._key(number, self.rank),
            np.array([len(self.rows), len(self.rows[0]), *itertools.chain(*self.rows)], np.int64).tobytes(),  # type: ignore[arg-type]  # bytes: the stubs say str
        )
        self.rows = []
        if self.everyone_reads or (number - 1) % self.world_size == self.rank:
            self.due.append((number, time.monotonic()))

    def agree_at_close(self, unchecked: bool, edited: bool, timeout_s: float) -> tuple[bool, str]:
        """Whether every rank compares its last steps at close: each says whether it ran
        steps after its last check, and whether its parameters changed after its last
        step; all then read the same totals. (go, what to record: "" for nothing)."""
        if self.stopped:
            return False, ""
        deadline = time.monotonic() + timeout_s
        try:
            self.store.add("close/unchecked", int(unchecked))
            self.store.add("close/edited", int(edited))
            self._meet("close/met", deadline)
            n_unchecked = self.store.add("close/unchecked", 0)
            n_edited = self.store.add("close/edited", 0)
        except Exception as exc:
            self._give_up(self.probe.step, exc)
            return False, ""
        step = self.probe.step
        if n_unchecked < self.world_size:
            if n_unchecked == 0:
                return False, ""  # the last step was a check step everywhere
            return False, (
                f"{contract.NOT_COMPARED_AT_CLOSE}{self.world_size - n_unchecked} of {self.world_size} "
                f"ranks did not reach close after an unchecked step (this rank: after step {step})"
            )
        if n_edited:
            return False, (
                f"{contract.NOT_COMPARED_AT_CLOSE}the parameters changed after the last step on "
                f"{n_edited} of {self.world_size} ranks (code after training: a checkpoint loaded, "
                f"weights written back), so they no longer show what training left"
            )
        return True, f"the steps after the last check compared once more at close, after step {step}"

    def finish(self, timeout_s: float) -> None:
        """At the end of the run: post the last, short block, read what is still due,
        waiting at most `timeout_s` for ranks that have not posted it, then pick up any
        last verdict."""
        if self.stopped:
            self._take_last_verdicts()
            return
        deadline = time.monotonic() + timeout_s
        try:
            if self.rows:
                self._post()
            self._arrive("posted")  # every rank's last block is in the store once all have
            all_posted = False
            while self.due and not self.stopped:
                self._read_due(None, deadline=deadline)
                if self.due and not self.stopped:
                    _, posted_at = self.due[0]
                    if all_posted or not self._wait_keys(["posted/all"], min(deadline, posted_at + self.timeout_s)):
                        time.sleep(CLOSE_POLL_S)  # a block every rank has posted is still missing: look again later
                    else:
                        all_posted = True
            # Every rank's last reads are done (and their verdicts published) before anyone
            # takes the last verdicts: then every rank records every mismatch.
            self._meet("finished", deadline)
            self._take_last_verdicts()
            if self.rank == 0:
                # Rank 0 usually hosts the store (Lightning, mp.spawn, a plain
                # init_process_group): it stays until the others have taken the verdicts.
                self._meet("left", deadline)
            else:
                self._arrive("left")
        except Exception as exc:
            self._give_up(self.probe.step, exc)
        self.stopped = True

    def _take_last_verdicts(self) -> None:
        """Record the verdicts other ranks published, also after a read that gave up on a
        late rank (what was published before is in the store all the same); not when the
        store itself stopped answering."""
        if self.everyone_reads or self.store_failed:
            return
        try:
            self._poll_verdicts()
        except Exception as exc:
            self._give_up(self.probe.step, exc)

    def _arrive(self, key: str) -> None:
        """Count this rank in at `key`; the last rank to arrive says so in `key/all`."""
        if self.store.add(key, 1) >= self.world_size:
            self.store.set(f"{key}/all", "1")

    def _meet(self, key: str, deadline: float) -> None:
        """Count this rank in at `key` and wait until every rank has, or until `deadline`
        (a rank that died does not hold the job's end)."""
        self._arrive(key)
        while self.store.add(key, 0) < self.world_size and time.monotonic() < deadline:
            if not self._wait_keys([f"{key}/all"], deadline):
                time.sleep(CLOSE_POLL_S)  # never a busy loop on a store that does not answer

    def _wait_keys(self, keys: list[str], until: float) -> bool:
        """Wait for `keys` with the store's own wait, which wakes this rank as soon as they
        are set (the job's end is not held by a polling interval), at most until `until`
        (monotonic). False where it timed out or the store did not answer."""
        left = until - time.monotonic()
        if left <= 0:
            return False
        try:
            self.store.wait(keys, timedelta(seconds=left))
        except Exception:
            return False
        return True

    def _read_due(self, upto: int | None, deadline: float | None = None) -> None:
        """Read the due blocks that end at check `upto` or before (None: all), oldest
        first; stop at the first one some rank has not posted yet, and give up on it
        once it has waited `timeout_s` (or past `deadline`)."""
        while self.due and (upto is None or self.due[0][0] * self.block <= upto) and not self.stopped:
            number, posted_at = self.due[0]
            first = (number - 1) * self.block + 1
            keys = [self._key(number, r) for r in range(self.world_size)]
            slot = number % self.ring
            blocks: list[np.ndarray] = []
            if slot in self.ready_slots or self.store.check(keys):
                self.ready_slots.add(slot)
                blocks = [rows_of(v) for v in self.store.multi_get(keys)]
            missing = [
                r
                for r in range(self.world_size)
                if r >= len(blocks) or not len(blocks[r]) or int(blocks[r][0, 0]) != first
            ]  # a stale slot holds an older block
            if missing:
                now = time.monotonic()
                if now - posted_at > self.timeout_s or (deadline is not None and now > deadline):
                    if not blocks:  # name only the ranks whose slot is still empty
                        missing = [r for r, key in enumerate(keys) if not self.store.check([key])]
                    self._incomplete(first, missing, now - posted_at)
                return
            self.due.pop(0)
            checks = min(len(rows) for rows in blocks)  # the last block may be short
            table = np.stack([rows[:checks, : 1 + WIDTH] for rows in blocks])  # rank x check x field
            if not self._block_is_clean(table):
                for n in range(checks):
                    self._evaluate(first + n, [rows[n] for rows in blocks])
                if self.healer is not None:
                    self.healer.after_block(first, blocks)
                continue
            # The usual case, in one record: every check of the block agreed.
            steps = table[self.rank, :, 1 + FIELDS.index("step")]
            buffers = table[:, :, 1 + FIELDS.index("buffer_fp")]
            self._write_ok(
                int(steps[0]),
                int(steps[-1]),
                checks,
                not self.buffers_must_match and bool((buffers != buffers[0]).any()),
            )

    def _write_ok(self, first_step: int, step: int, checks: int, buffers_differ_unsynced: bool) -> None:
        detail: dict[str, Any] = {"first_step": first_step, "checks": checks}
        if buffers_differ_unsynced:
            detail["buffers_differ_unsynced"] = True
        self.probe.writer.write(
            contract.KIND_CHECK, rank=self.rank, step=step, status="ok", what=[], ranks=[], tensor=None, detail=detail
        )

    def _block_is_clean(self, table: np.ndarray) -> bool:
        """Every must-match value equal on every rank, every replica group in agreement,
        and no two ranks of different data shards with the same batch, at every check of
        the block (the fast path of compare_groups(); anything else goes the exact way)."""
        must = table[:, :, self._must_columns]
        if not (must == must[:1]).all():
            return False
        for c in range(MAX_CLASSES):
            base = 1 + len(FIELDS) + c * len(CLASS_FIELDS)
            keys, values = table[:, :, base], table[:, :, base + 1 : base + len(CLASS_FIELDS)]
            if (keys == keys[:1]).all():
                if not (values == values[:1]).all():
                    return False
            elif not groups_agree(keys, values):
                return False
        data = np.sort(table[:, :, 1 + FIELDS.index("data_fp")], axis=0)
        return not ((data[1:] == data[:-1]) & (data[1:] != 0)).any()

    def _evaluate(self, index: int, rows: list[np.ndarray]) -> None:
        table = [[int(v) for v in row[1 : 1 + WIDTH]] for row in rows]
        step = table[self.rank][0]
        what, ranks, groups = compare_groups(table, self.buffers_must_match)
        detail: dict[str, Any] = {f: [row[i] for row in table] for i, f in enumerate(FIELDS[: N_INT + 1])}
        detail["loss"] = [bits_float(row[N_INT + 1]) for row in table]
        detail["grad_norm"] = [bits_float(row[N_INT + 2]) for row in table]
        unsynced = len(set(detail["buffer_fp"])) > 1 and not self.buffers_must_match
        if not what:  # all equal: the per-rank values are in each rank's step records already
            self._write_ok(step, step, 1, unsynced)
            return
        if unsynced:
            detail["buffers_differ_unsynced"] = True
        layout = self.layout
        if layout is not None and layout.sharded and groups:
            detail["groups"] = [
                {**g, "dims": list(layout.classes[g["class"]]) if g["class"] < len(layout.classes) else []}
                for g in groups[:16]
            ]
        tensor = None
        if "param" in what:
            first = next((g for g in groups if "param" in g["what"]), None)
            tensor, parted, compared = self._differing_tensors([row[1 + WIDTH :] for row in rows], first)
            if compared:
                # How far the change reaches: one flipped bit changes one tensor (the
                # all-reduce keeps every other equal); code that treats a rank apart
                # (clipping, a weight copy, a skipped reduction) changes most of them.
                detail["tensors_differ"] = [parted, compared]
        self.probe.writer.write(
            contract.KIND_CHECK,
            rank=self.rank,
            step=step,
            status="mismatch",
            what=what,
            ranks=ranks,
            tensor=tensor,
            detail=detail,
        )
        verdict = {
            "index": index,
            "step": step,
            "what": what,
            "ranks": ranks,
            "tensor": tensor,
            "detail": detail,
            "reader": self.rank,
        }
        first_time = self._report(verdict)
        if first_time and not self.everyone_reads:
            number = self.store.add("verdicts", 1)
            self.store.set(f"verdict/{number}", json.dumps(verdict))

    def _differing_tensors(
        self, per_group: list[np.ndarray], group: dict[str, Any] | None = None
    ) -> tuple[str | None, int, int]:
        """The first parameter, in parameter order, whose fingerprint is not the same on
        every rank of the replica group that disagrees (with more tensors than
        TENSOR_GROUPS, the first group of tensors that differs, named by its first and
        last tensor), and how many of the compared tensors (or groups) differ. Under a
        mesh only the tensors of the group's placement class count: the others are other
        shards by design."""
        names = [n for n, _ in self.probe._named_params]
        bounds = group_bounds(len(names))
        if any(len(g) != len(bounds) for g in per_group) or not bounds:
            return None, 0, 0  # ranks with other models: the config and counters say more than a name
        members = group["members"] if group else list(range(len(per_group)))
        table = np.stack([per_group[r] for r in members])
        differs = (table != table[0]).any(axis=0)
        layout = self.layout
        if layout is not None and layout.sharded and group is not None:
            of_tensor = layout.of_tensor
            same_class = [all(of_tensor[i] == group["class"] for i in range(a, b)) for a, b in bounds]
            differs &= np.array(same_class, dtype=bool)
            compared = sum(same_class)
        else:
            compared = len(bounds)
        hits = np.flatnonzero(differs)
        if not hits.size:
            return None, 0, compared
        start, end = bounds[int(hits[0])]
        name = names[start] if end - start == 1 else f"{names[start]} .. {names[end - 1]}"
        return name, int(hits.size), compared

    def _poll_verdicts(self) -> None:
        """Mismatches found by the ranks that read them: record them here too (each
        rank's file then holds the evidence) and act on them."""
        self.polled_at = time.monotonic()
        count = self.store.add("verdicts", 0)
        while self.verdicts_seen < count:
            self.verdicts_seen += 1
            verdict = json.loads(self.store.get(f"verdict/{self.verdicts_seen}"))
            if verdict["reader"] == self.rank:
                continue
            self.probe.writer.write(
                contract.KIND_CHECK,
                rank=self.rank,
                step=verdict["step"],
                status="mismatch",
                what=verdict["what"],
                ranks=verdict["ranks"],
                tensor=verdict["tensor"],
                detail={**verdict["detail"], "reader": verdict["reader"]},
            )
            self._report(verdict)

    def _report(self, verdict: dict[str, Any]) -> bool:
        """Print, dump and (by choice) raise, once per kind of mismatch; True the first time."""
        step, what, ranks, tensor = verdict["step"], verdict["what"], verdict["ranks"], verdict["tensor"]
        key = tuple(what)
        if key in self.reported:
            return False
        self.reported.add(key)
        message = mismatch_message(step, what, ranks, tensor, self.world_size)
        if self.rank in (0, verdict["reader"], *ranks[:1]):
            print_verdict(message)
        if self.probe.on_mismatch in ("dump", "raise"):
            from syncdoctor.probe.core.evidence import dump_evidence

            try:
                dump_evidence(self.probe, {**verdict, "message": message}, tensor)
            except Exception as exc:  # a full disk must not stop the checks
                print(f"syncdoctor: rank {self.rank}: evidence not written: {exc}", file=sys.stderr)
        if self.probe.on_mismatch == "raise" and self.pending_error is None:
            self.pending_error = SyncMismatchError(message)  # the first mismatch of the block read
        return True

    def _incomplete(self, index: int, missing: list[int], waited_s: float) -> None:
        step = self.probe.step
        self._stop(
            step,
            f"rank(s) {missing} did not post check {index} within {waited_s:.0f}s",
            {"missing": missing, "check": index, "waited_s": round(waited_s, 1), "timeout_s": self.timeout_s},
        )

    def _give_up(self, step: int, exc: BaseException) -> None:
        self.store_failed = True
        self._stop(
            step,
            f"the job's store did not answer ({type(exc).__name__})",
            {"error": f"{type(exc).__name__}: {str(exc)[:300]}", "timeout_s": self.timeout_s},
        )

    def _stop(self, step: int, why: str, detail: dict[str, Any]) -> None:
        if self.stopped:
            return
        self.stopped = True
        self.due.clear()
        self.probe.writer.write(
            contract.KIND_CHECK,
            rank=self.rank,
            step=step,
            status="incomplete",
            what=[],
            ranks=detail.get("missing", []),
            tensor=None,
            detail=detail,
        )
        print(
            f"syncdoctor: rank {self.rank}: cross-rank check at step {step} could not complete: {why}; checks stopped",
            file=sys.stderr,
            flush=True,
        )
