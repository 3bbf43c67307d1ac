"""Data and bookkeeping shared by the zoo's training programs: the handwritten-digits
set scikit-learn ships (no download), as images or as token sequences, and the
fingerprint of the final weights each program writes so the tests can compare runs
with and without the probe bitwise."""

from __future__ import annotations

import hashlib
import os

import torch
from torch.utils.data import Dataset, TensorDataset


def digits_images() -> TensorDataset:
    """1797 8x8 grey images in [0, 1], labels 0-9."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    x = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0
    y = torch.tensor(digits.target, dtype=torch.long)
    return TensorDataset(x, y)


class DigitTokens(Dataset):
    """Each digit as a sequence of 64 tokens (pixel intensity 0-16, +2 so 0/1 stay
    [PAD]/[CLS]-like ids) for the transformer models: dict items a Trainer collates."""

    vocab_size = 20

    def __init__(self) -> None:
        images = digits_images()
        self.ids = (images.tensors[0].flatten(1) * 16).round().long() + 2
        self.labels = images.tensors[1]

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "attention_mask": torch.ones_like(self.ids[i]), "labels": self.labels[i]}


def state_hash(state: dict[str, torch.Tensor]) -> str:
    """sha256 over every tensor of a state_dict, in key order."""
    h = hashlib.sha256()
    for name in sorted(state):
        value = state[name]
        if isinstance(value, torch.Tensor):
            h.update(name.encode())
            h.update(value.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def save_final(out_dir: str | None, rank: int, state: dict[str, torch.Tensor]) -> None:
    """Write this rank's final weights' hash to OUT_DIR/final{rank}.sha256."""
    if out_dir:
        os.makedirs(out_dir, exist_ok=True)
        with open(os.path.join(out_dir, f"final{rank}.sha256"), "w") as fh:
            fh.write(state_hash(state) + "\n")
