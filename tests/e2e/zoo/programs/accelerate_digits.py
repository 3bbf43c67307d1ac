"""A plain training loop with Hugging Face accelerate, as its quick tour writes it,
started with `accelerate launch --multi_gpu --num_processes 2` (on CPU:
`Accelerator(cpu=True)` over gloo).

--bug switches on one silent mistake accelerate users report:
  unprepared_loader  the DataLoader is left out of `accelerator.prepare`: every process
                     iterates the whole dataset in the same (seeded) order.
                     https://github.com/huggingface/accelerate/issues/3336
  lr_main_only       a manual learning-rate decay applied under
                     `if accelerator.is_main_process:` -- the replicas step with
                     different learning rates from the decay on.
                     https://github.com/huggingface/accelerate/issues/94
  unprepared_model   the model is left out of `accelerator.prepare`: no DDP wrapper, so
                     the gradients are never averaged and each process trains its own copy.
                     https://github.com/huggingface/accelerate/issues/2316 (what prepare
                     does to each object)
--syncdoctor DIR     `syncdoctor.attach(model, optimizer, run_dir=DIR)` after prepare.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
from accelerate import Accelerator
from accelerate.utils import set_seed
from torch.utils.data import DataLoader
from user_ops import record, user_moment
from zoo_data import digits_images, save_final

DECAY_AT = 10  # lr_main_only: the decay happens after this step


def build_model() -> nn.Module:
    return nn.Sequential(
        nn.Flatten(),
        nn.Linear(64, 64),
        nn.ReLU(),
        nn.Dropout(0.1),
        nn.Linear(64, 10),
    )


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--bug", default="")
    p.add_argument("--syncdoctor", metavar="DIR")
    p.add_argument("--check-every", type=int, default=5)
    p.add_argument("--final-dir")
    p.add_argument("--ops-dir", help="run user_ops at three moments, outcomes here")
    args = p.parse_args()

    torch.set_num_threads(1)
    accelerator = Accelerator(cpu=True)
    set_seed(0)
    model = build_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    dataset = digits_images()
    loader = DataLoader(dataset, batch_size=32, shuffle=True, drop_last=True)
    if args.bug == "unprepared_loader":
        model, optimizer = accelerator.prepare(model, optimizer)
    elif args.bug == "unprepared_model":
        optimizer, loader = accelerator.prepare(optimizer, loader)
    else:
        model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    probe = None
    if args.syncdoctor:
        import syncdoctor

        probe = syncdoctor.attach(model, optimizer, run_dir=args.syncdoctor, check_every=args.check_every)
    example = torch.stack([dataset[i][0] for i in range(2)])
    rank = accelerator.process_index
    record(args.ops_dir, rank, "built", accelerator.unwrap_model(model), model, optimizer, example)

    model.train()
    step = 0
    while step < args.steps:
        for x, y in loader:
            loss = F.cross_entropy(model(x), y)
            accelerator.backward(loss)
            if probe is not None:
                probe.loss(loss)
            optimizer.step()
            optimizer.zero_grad()
            step += 1
            if moment := user_moment(step, args.check_every):
                record(args.ops_dir, rank, moment, accelerator.unwrap_model(model), model, optimizer, example)
            if step == DECAY_AT and args.bug == "lr_main_only" and accelerator.is_main_process:
                for group in optimizer.param_groups:
                    group["lr"] *= 0.1
            accelerator.print(f"step {step} loss {loss.item():.4f}")
            if step >= args.steps:
                break
    accelerator.wait_for_everyone()
    if probe is not None:
        probe.close()
    save_final(args.final_dir, accelerator.process_index, accelerator.unwrap_model(model).state_dict())
    accelerator.end_training()


if __name__ == "__main__":
    main()
