"""PyTorch Lightning: `Trainer(callbacks=[SyncDoctorCallback("runs/job42")])`.

The probe attaches when the first training batch starts: Lightning has wrapped the
module in DDP and built the optimizers, every `on_fit_start`/`on_train_start` hook of
the user's has run (one that changes a learning rate is seen in the snapshot), and no
update has happened. The loss Lightning passes to `backward` is recorded at
`on_before_backward`. The probe is closed at teardown,
also when training raises."""

from __future__ import annotations

import os
from typing import Any


def _callback_base() -> type:
    try:
        from lightning.pytorch import Callback
    except ImportError:  # the older standalone package
        from pytorch_lightning import Callback  # type: ignore[assignment]  # its other package: another class to mypy
    return Callback


class _SyncDoctorCallback:
    """Attaches the syncdoctor probe to a Lightning run: `run_dir` and the keyword
    options are `syncdoctor.attach`'s (check_every, on_mismatch, ...)."""

    def __init__(self, run_dir: str | os.PathLike[str] | None = None, **probe_options: Any) -> None:
        self.run_dir = run_dir
        self.probe_options = probe_options
        self.probe: Any = None

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        if self.probe is not None:
            return
        from syncdoctor.probe.torch.probe import attach

        optimizers = list(getattr(trainer, "optimizers", []) or [])
        model = getattr(trainer.strategy, "model", None) or pl_module  # the DDP wrapper when there is one
        options = dict(self.probe_options)
        options.setdefault("loader", _first_loader(getattr(trainer, "train_dataloader", None)))
        self.probe = attach(model, optimizers[0] if optimizers else None, run_dir=self.run_dir, **options)

    def on_before_backward(self, trainer: Any, pl_module: Any, loss: Any) -> None:
        if self.probe is not None:
            self.probe.loss(loss)

    def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if self.probe is not None:
            self.probe.close()
            self.probe = None


def _first_loader(loaders: Any) -> Any:
    """Lightning may hold the training loaders in a CombinedLoader or a collection."""
    inner = getattr(loaders, "iterables", loaders)
    if isinstance(inner, dict):
        inner = next(iter(inner.values()), None)
    elif isinstance(inner, (list, tuple)):
        inner = inner[0] if inner else None
    return inner if hasattr(inner, "batch_size") else None


def __getattr__(name: str) -> Any:
    if name == "SyncDoctorCallback":
        cls = type(
            "SyncDoctorCallback",
            (_SyncDoctorCallback, _callback_base()),
            {"__module__": __name__, "__doc__": _SyncDoctorCallback.__doc__},
        )  # Callback only when used
        globals()[name] = cls
        return cls
    raise AttributeError(name)
