"""A small PyTorch Lightning classifier on the digits set, as a Lightning user writes
it: `Trainer(accelerator="cpu", devices=2, strategy="ddp")`, started either with
`python lightning_digits.py` (Lightning's own launcher re-runs this script for rank 1)
or under `python -m torch.distributed.run --nproc-per-node 2`.

--bug switches on one silent mistake that Lightning users report:
  no_dist_sampler  `use_distributed_sampler=False` with an ordinary shuffled loader
                   (seeded alike on every rank): every rank trains on the same batches.
                   https://github.com/Lightning-AI/pytorch-lightning/issues/8562
                   https://github.com/Lightning-AI/pytorch-lightning/issues/6423
  eval_rank0       a `@rank_zero_only` preview hook puts the module in eval mode and
                   never puts it back: rank 0 trains without dropout and with frozen
                   BatchNorm statistics from step PREVIEW_AT+1 on.
                   https://github.com/shubhamagarwal92/mmd/issues/14
  lr_rank0         a tuned learning rate applied in a `@rank_zero_only` hook: the ranks
                   step with different learning rates.
                   https://github.com/Lightning-AI/pytorch-lightning/pull/15304 (lr finder
                   under DDP), https://github.com/huggingface/accelerate/issues/94
  accumulate_rank0 `accumulate_grad_batches` from a per-node setting only rank 0 has
                   (2, the others 1): the ranks disagree about which micro-steps
                   all-reduce and hang in the first synchronised backward until the
                   process group's timeout (20 s here). Not a zoo scenario (a hang costs
                   the CI its timeout): the source of tests/rules/SD411/fire_hang.
--syncdoctor DIR adds syncdoctor's Lightning callback (the one-line attach).
"""

from __future__ import annotations

import argparse
import os
from datetime import timedelta

import lightning as L
import torch
import torch.nn as nn
import torch.nn.functional as F
from lightning.pytorch.strategies import DDPStrategy
from lightning.pytorch.utilities import rank_zero_only
from torch.utils.data import DataLoader
from user_ops import record, user_moment
from zoo_data import digits_images, save_final

PREVIEW_AT = 8  # the eval_rank0 preview runs after this step


class DigitClassifier(L.LightningModule):
    def __init__(self, lr: float = 0.05, tuned_lr: float = 0.2, bug: str = "") -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(
            nn.Conv2d(1, 16, 3, padding=1),
            nn.BatchNorm2d(16),
            nn.ReLU(),
            nn.Dropout(0.25),
            nn.Flatten(),
            nn.Linear(16 * 8 * 8, 10),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        self.log("train_loss", loss)
        return loss

    def on_train_start(self) -> None:
        if self.hparams.bug == "lr_rank0":
            self.apply_tuned_lr()
        self.user_ops("built")

    def user_ops(self, moment: str) -> None:
        ops_dir = getattr(self, "ops_dir", None)
        if ops_dir:
            example = torch.stack([digits_images()[i][0] for i in range(2)])
            trainer = self.trainer
            record(ops_dir, trainer.global_rank, moment, self, trainer.strategy.model, trainer.optimizers[0], example)

    @rank_zero_only
    def apply_tuned_lr(self) -> None:
        for group in self.trainer.optimizers[0].param_groups:
            group["lr"] = self.hparams.tuned_lr

    def on_train_batch_end(self, outputs: object, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        if moment := user_moment(self.global_step, getattr(self, "check_every", 5)):
            self.user_ops(moment)
        if self.hparams.bug == "eval_rank0" and self.global_step == PREVIEW_AT:
            self.preview(batch[0][:4])

    @rank_zero_only
    def preview(self, x: torch.Tensor) -> None:
        self.eval()
        with torch.no_grad():
            print(f"preview predictions: {self(x).argmax(1).tolist()}", flush=True)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr, momentum=0.9)


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
    L.seed_everything(0, verbose=False)
    shuffle = torch.Generator().manual_seed(0)
    loader = DataLoader(digits_images(), batch_size=32, shuffle=True, generator=shuffle, drop_last=True)
    callbacks = []
    if args.syncdoctor:
        from syncdoctor.probe.integrations.lightning import SyncDoctorCallback

        callbacks.append(SyncDoctorCallback(args.syncdoctor, check_every=args.check_every))
    accumulate = 2 if args.bug == "accumulate_rank0" and os.environ.get("LOCAL_RANK", "0") == "0" else 1
    strategy = DDPStrategy(timeout=timedelta(seconds=20)) if args.bug == "accumulate_rank0" else "ddp"
    trainer = L.Trainer(
        accelerator="cpu",
        devices=2,
        strategy=strategy,
        accumulate_grad_batches=accumulate,
        max_steps=args.steps,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        use_distributed_sampler=args.bug != "no_dist_sampler",
        callbacks=callbacks,
    )
    model = DigitClassifier(bug=args.bug)
    model.ops_dir, model.check_every = args.ops_dir, args.check_every
    trainer.fit(model, loader)
    save_final(args.final_dir, trainer.global_rank, model.state_dict())


if __name__ == "__main__":
    main()
