"""An ordinary DDP training script, with no syncdoctor in it: what `syncdoctor run`
must attach to. Options used by the tests: --exit-code (end with that code),
--comm-hook (register the script's own DDP comm hook), --steps, --seed,
--accumulate N (N micro-steps per update, the first N-1 under `no_sync`), --clip all:NORM,
and the silent bugs --odd-weight-decay-rank R, --nan-at RANK:STEP, --accumulate RANK:N
(that rank alone accumulates N micro-steps: a per-node config that drifted) and
--clip RANK:NORM (that rank alone clips the averaged gradients) and --unsynced-every N
(every N-th update reads unaveraged gradients on every rank); --scale-all-at and
--scale-data-at RANK:STEP write the weights of one rank outside the update (counted by
torch's version counters, and through `p.data`, not counted); --rebind-at RANK:STEP
gives that rank's fc.weight new storage after update STEP, with half its values zeroed
(a pruned export made from the training model: what `torch.nn.utils.prune.remove` does);
--split-batch RANK (healthy: that rank reads half-size batches, two per update).

With SYNCDOCTOR_TEST_PAUSE="where:rank:step" (kill tests only) one rank stops at a
chosen point (mid-record, just before the check, inside the comm hook), writes
SYNCDOCTOR_TEST_MARKER and sleeps until the test SIGKILLs it.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

PAUSE = os.environ.get("SYNCDOCTOR_TEST_PAUSE", "")


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--exit-code", type=int, default=0)
    p.add_argument("--comm-hook", action="store_true")
    p.add_argument("--pg-timeout", type=float, default=20.0)
    # Silent bugs for the round-trip tests: a rank-dependent weight decay, a loss
    # that turns NaN on one rank ("1:12") or on all ("all:12") from a step on.
    p.add_argument("--odd-weight-decay-rank", type=int, default=None)
    p.add_argument("--nan-at", default=None)
    # Replicas parted silently after the optimizer step from STEP on, on RANK ("1:22");
    # and, after the last step, weights changed on one rank only (a best checkpoint
    # loaded for a rank-0 evaluation): the near miss of a close-time comparison.
    p.add_argument("--part-at", default=None)
    p.add_argument("--edit-after-training", type=int, default=None)
    # Every weight of RANK scaled once, after the optimizer step STEP ("0:12"): a rank-0
    # branch writing weights (an EMA copy, a checkpoint load), not a flipped bit.
    p.add_argument("--scale-all-at", default=None)
    # The same through `p.data` (EMA weights copied in for a rank-0 evaluation and never
    # restored): writes torch's version counters do not count.
    p.add_argument("--scale-data-at", default=None)
    # fc.weight of RANK pruned in place after the optimizer step STEP ("0:12"), as an
    # export that prunes the training model instead of a copy: `p.data = new tensor`.
    p.add_argument("--rebind-at", default=None)
    # A resume that loads the optimizer's state on RANK only (the momentum of a saved
    # run, under an `if rank == 0:`): every rank starts from the same weights.
    p.add_argument("--resume-momentum-rank", type=int, default=None)
    p.add_argument("--accumulate", default="1")
    # --split-batch RANK: that rank reads half-size batches and accumulates two per update
    # (loss halved): the same samples and one synchronised backward per update, as a rank
    # short of memory does. Healthy.
    p.add_argument("--split-batch", type=int, default=None)
    # Gradient clipping between backward and the update, on RANK only or on "all"
    # ("0:0.05"): the all-reduce delivers the same gradient, one rank then rescales it.
    p.add_argument("--clip", default=None)
    # Every N-th update's last micro-step also runs inside no_sync, on every rank (a
    # flush at the end of an epoch that still counted as an accumulation step): the
    # update reads each rank's own gradients, though the ranks agree on the schedule.
    p.add_argument("--unsynced-every", type=int, default=0)
    return p.parse_args(argv)


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.fc = nn.Linear(8 * 8 * 8, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.relu(self.bn(self.conv(x))).flatten(1))


def pause_here(where: str, rank: int, step: int) -> None:
    if not PAUSE:
        return
    p_where, p_rank, p_step = PAUSE.split(":")
    if where == p_where and rank == int(p_rank) and step == int(p_step):
        with open(os.environ["SYNCDOCTOR_TEST_MARKER"], "w") as fh:
            fh.write(str(os.getpid()))
        time.sleep(3600)


def install_pause_points(rank: int, state: dict) -> None:
    """Kill tests only: stop inside the probe's record writer or just before its check."""
    if not PAUSE:
        return
    from syncdoctor.probe.torch.check import CrossRankCheck
    from syncdoctor.records import tail
    from syncdoctor.records.writer import RecordWriter

    write_line, submit, put = RecordWriter.write_line, CrossRankCheck.submit, tail.StepTail.put

    p_where, p_rank, p_step = PAUSE.split(":")
    pause_record = b'"kind":"step","rank":%d,"step":%d,' % (rank, int(p_step))

    def paused_write_line(self, line):  # type: ignore[no-untyped-def]
        # Every record but the every-step ones goes through write_line, after the pending steps.
        if p_where == "record" and rank == int(p_rank) and pause_record in line:
            if self._tail is not None and self._tail.pending:
                line = self._tail.lines() + line
            os.write(self._fd, line[: len(line) - 20])  # cut inside the record
            pause_here("record", rank, int(p_step))
        return write_line(self, line)

    def paused_put(self, step, *values):  # type: ignore[no-untyped-def]
        # The every-step record: its entry in the tail is written but not yet counted.
        if p_where == "record" and rank == int(p_rank) and step == int(p_step):
            self._body(self._map, tail._HEADER.size + self.pending * tail.SLOT + tail._SEQ.size, step, *values)
            pause_here("record", rank, int(p_step))
        return put(self, step, *values)

    def paused_submit(self, record):  # type: ignore[no-untyped-def]
        pause_here("check", rank, record["step"])
        return submit(self, record)

    RecordWriter.write_line, CrossRankCheck.submit, tail.StepTail.put = paused_write_line, paused_submit, paused_put


def train(rank: int, world_size: int, args: argparse.Namespace) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world_size, timeout=timedelta(seconds=args.pg_timeout))
    torch.manual_seed(args.seed)
    g = torch.Generator().manual_seed(1234)
    data = TensorDataset(torch.randn(512, 1, 8, 8, generator=g), torch.randint(0, 10, (512,), generator=g))
    sampler = DistributedSampler(data, num_replicas=world_size, rank=rank, shuffle=True, seed=args.seed)
    split = rank == args.split_batch
    loader = DataLoader(data, batch_size=8 if split else 16, sampler=sampler, drop_last=True)
    model = DDP(Net())
    state = {"step": 0}
    install_pause_points(rank, state)
    if args.comm_hook:

        def mean_hook(hook_state, bucket):  # type: ignore[no-untyped-def]
            pause_here("hook", rank, state["step"] + 1)
            buf = bucket.buffer().div_(world_size)
            return dist.all_reduce(buf, async_op=True).get_future().then(lambda f: f.value()[0])

        model.register_comm_hook(None, mean_hook)
    loss_fn = nn.CrossEntropyLoss(label_smoothing=0.1)
    weight_decay = 1e-2 if rank == args.odd_weight_decay_rank else 0.0
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=weight_decay)
    if rank == args.resume_momentum_rank:
        for param in model.parameters():
            optimizer.state[param]["momentum_buffer"] = torch.full_like(param, 0.01)
    nan_rank, nan_step = args.nan_at.split(":") if args.nan_at else (None, "0")
    part_rank, part_step = args.part_at.split(":") if args.part_at else (None, "0")
    scale_rank, scale_step = args.scale_all_at.split(":") if args.scale_all_at else (None, "0")
    data_rank, data_step = args.scale_data_at.split(":") if args.scale_data_at else (None, "0")
    rebind_rank, rebind_step = args.rebind_at.split(":") if args.rebind_at else (None, "0")
    accumulate_rank, accumulate = args.accumulate.split(":") if ":" in args.accumulate else (str(rank), args.accumulate)
    micro_steps = 2 if split else int(accumulate) if accumulate_rank == str(rank) else 1
    clip_rank, clip_norm = args.clip.split(":") if args.clip else (None, "0")
    micro = 0
    epoch = 0
    while state["step"] < args.steps:
        sampler.set_epoch(epoch)
        for x, y in loader:
            micro += 1
            last_micro = micro == micro_steps
            unsynced = args.unsynced_every and (state["step"] + 1) % args.unsynced_every == 0
            with contextlib.nullcontext() if last_micro and not unsynced else model.no_sync():
                loss = loss_fn(model(x), y) / (micro_steps if split else 1)
                if nan_rank in ("all", str(rank)) and state["step"] + 1 >= int(nan_step):
                    loss = loss * float("nan")
                loss.backward()
            if not last_micro:
                continue
            micro = 0
            if clip_rank in ("all", str(rank)):
                torch.nn.utils.clip_grad_norm_(model.parameters(), float(clip_norm))
            optimizer.step()
            optimizer.zero_grad()
            state["step"] += 1
            if part_rank == str(rank) and state["step"] >= int(part_step):
                with torch.no_grad():
                    model.module.fc.bias.mul_(1.001)
            if scale_rank == str(rank) and state["step"] == int(scale_step):
                with torch.no_grad():
                    for p in model.module.parameters():
                        p.mul_(0.999)
            if data_rank == str(rank) and state["step"] == int(data_step):
                for p in model.module.parameters():
                    p.data.mul_(0.999)
            if rebind_rank == str(rank) and state["step"] == int(rebind_step):
                weight = model.module.fc.weight
                keep = weight.detach().abs() >= weight.detach().abs().median()
                weight.data = torch.where(keep, weight.detach(), torch.zeros_like(weight))  # new storage
            print(f"rank {rank} step {state['step']} loss {loss.item():.4f}", flush=True)
            if state["step"] >= args.steps:
                break
        epoch += 1
    if args.edit_after_training == rank:
        with torch.no_grad():
            for p in model.module.parameters():
                p.mul_(0.5)
    print(f"rank {rank} done", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    arguments = parse()
    train(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), arguments)
    sys.exit(arguments.exit_code)
