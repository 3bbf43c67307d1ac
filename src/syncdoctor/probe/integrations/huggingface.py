"""Hugging Face `Trainer`: `Trainer(..., callbacks=[SyncDoctorTrainerCallback("runs/job42")])`.

The probe attaches at `on_train_begin`: the Trainer has wrapped the model (DDP) and
built the optimizer by then, and no update has happened. The Trainer computes the
loss inside the model (or in its label smoother) and hands callbacks no per-step
loss, so the loss recorded is the scalar the Trainer passes to `backward()`, as in
zero-code mode (divided by the gradient-accumulation steps, as the Trainer does)."""

from __future__ import annotations

import os
from typing import Any


def _callback_base() -> type:
    from transformers import TrainerCallback

    return TrainerCallback


class _SyncDoctorTrainerCallback:
    """Attaches the syncdoctor probe to a Hugging Face Trainer run: `run_dir` and the
    keyword options are `syncdoctor.attach`'s (check_every, on_mismatch, ...)."""

    def __init__(self, run_dir: str | os.PathLike[str] | None = None, **probe_options: Any) -> None:
        self.run_dir = run_dir
        self.probe_options = probe_options
        self.probe: Any = None

    def on_train_begin(
        self,
        args: Any,
        state: Any,
        control: Any,
        model: Any = None,
        optimizer: Any = None,
        train_dataloader: Any = None,
        **kwargs: Any,
    ) -> None:
        if self.probe is not None or model is None:
            return
        from syncdoctor.probe import attach

        options = dict(self.probe_options)
        options.setdefault("loader", train_dataloader)
        self.probe = attach(model, optimizer, run_dir=self.run_dir, **options)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.probe is not None:
            self.probe.close()
            self.probe = None


def __getattr__(name: str) -> Any:
    if name == "SyncDoctorTrainerCallback":
        cls = type(
            name,
            (_SyncDoctorTrainerCallback, _callback_base()),
            {"__module__": __name__, "__doc__": _SyncDoctorTrainerCallback.__doc__},
        )
        globals()[name] = cls  # built once, when first used: transformers only then
        return cls
    raise AttributeError(name)
