"""A Hugging Face `Trainer` fine-tuning a tiny BERT built from a config (no download)
on the digits as token sequences, started with
`python -m torch.distributed.run --nproc-per-node 2` (`use_cpu=True`, gloo).

The model is built before the Trainer with a per-rank seed (nanoGPT style,
https://github.com/karpathy/nanoGPT/issues/22): the replicas start from different
weights until DDP's broadcast makes them equal -- a healthy pattern.

--bug switches on one silent mistake Trainer users report:
  label_smoothing_rank1  the training arguments are built from a per-node setting that
                         only one node carries (`label_smoothing_factor`): rank 1
                         optimises a different loss.
                         https://github.com/huggingface/transformers/pull/10338 (the
                         Trainer's label smoother replaces the model's loss)
  own_loader             `get_train_dataloader` overridden with an ordinary shuffled
                         DataLoader (seeded alike): it bypasses the Trainer's sharding,
                         every rank trains on the same batches.
                         https://github.com/coqui-ai/Trainer/issues/144
  weight_decay_rank0     weight decay set in a rank-dependent branch (`if local_rank <= 0`).
                         https://github.com/huggingface/accelerate/issues/94
--syncdoctor DIR adds syncdoctor's TrainerCallback.
"""

from __future__ import annotations

import argparse
import os

import torch
from torch.utils.data import DataLoader
from transformers import (
    BertConfig,
    BertForSequenceClassification,
    Trainer,
    TrainerCallback,
    TrainingArguments,
    set_seed,
)
from user_ops import record, user_moment
from zoo_data import DigitTokens, save_final


class OwnLoaderTrainer(Trainer):
    def get_train_dataloader(self) -> DataLoader:
        shuffle = torch.Generator().manual_seed(self.args.seed)
        return DataLoader(
            self.train_dataset,
            batch_size=self.args.per_device_train_batch_size,
            shuffle=True,
            generator=shuffle,
            drop_last=True,
        )


class UserOps(TrainerCallback):
    """user_ops at the start of training and after steps, as a user's callback would."""

    def __init__(self, ops_dir: str, check_every: int) -> None:
        self.ops_dir, self.check_every, self.trainer = ops_dir, check_every, None
        tokens = DigitTokens()
        self.example = {k: torch.stack([tokens[i][k] for i in range(2)]) for k in ("input_ids", "attention_mask")}

    def _record(self, moment: str, model, optimizer) -> None:
        wrapper = self.trainer.model_wrapped if self.trainer is not None else None
        record(self.ops_dir, int(os.environ.get("RANK", "0")), moment, model, wrapper, optimizer, self.example)

    def on_train_begin(self, args, state, control, model=None, optimizer=None, **kwargs):
        self._record("built", model, optimizer)

    def on_step_end(self, args, state, control, model=None, optimizer=None, **kwargs):
        if moment := user_moment(state.global_step, self.check_every):
            self._record(moment, model, optimizer)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--bug", default="")
    p.add_argument("--syncdoctor", metavar="DIR")
    p.add_argument("--check-every", type=int, default=5)
    p.add_argument("--final-dir")
    p.add_argument("--ops-dir", help="run user_ops at three moments, outcomes here")
    p.add_argument("--output-dir", default=None)
    args = p.parse_args()

    torch.set_num_threads(1)
    local_rank = int(os.environ.get("LOCAL_RANK", "-1"))
    set_seed(1337 + max(local_rank, 0))
    config = BertConfig(
        vocab_size=DigitTokens.vocab_size,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=64,
        num_labels=10,
    )
    model = BertForSequenceClassification(config)

    smoothing = 0.2 if args.bug == "label_smoothing_rank1" and local_rank == 1 else 0.0
    weight_decay = 0.05 if args.bug == "weight_decay_rank0" and local_rank <= 0 else 0.0
    training_args = TrainingArguments(
        output_dir=args.output_dir or os.path.join(args.final_dir or ".", "hf_out"),
        use_cpu=True,
        ddp_backend="gloo",
        max_steps=args.steps,
        per_device_train_batch_size=16,
        learning_rate=1e-3,
        weight_decay=weight_decay,
        label_smoothing_factor=smoothing,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        seed=0,
        dataloader_num_workers=0,
        disable_tqdm=True,
    )
    callbacks = []
    if args.syncdoctor:
        from syncdoctor.probe.integrations.huggingface import SyncDoctorTrainerCallback

        callbacks.append(SyncDoctorTrainerCallback(args.syncdoctor, check_every=args.check_every))
    trainer_class = OwnLoaderTrainer if args.bug == "own_loader" else Trainer
    if args.ops_dir:
        callbacks.append(UserOps(args.ops_dir, args.check_every))
    trainer = trainer_class(model=model, args=training_args, train_dataset=DigitTokens(), callbacks=callbacks)
    for callback in callbacks:
        if isinstance(callback, UserOps):
            callback.trainer = trainer
    trainer.train()
    save_final(args.final_dir, trainer.args.process_index, model.state_dict())


if __name__ == "__main__":
    main()
