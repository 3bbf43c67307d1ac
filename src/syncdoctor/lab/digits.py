"""The digits set scikit-learn ships (1797 8×8 images), read straight from its data file.

`sklearn.datasets.load_digits` is the same `np.loadtxt` of that file, but importing
scikit-learn (and SciPy behind it) costs seconds of CPU in every process; a MindSpore
lab job starts three (msrun's scheduler runs the training script too). The file is found
without importing the package; where it is not, `load_digits` is used.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np


def load_digits_arrays() -> tuple[np.ndarray, np.ndarray]:
    """(images N×8×8 float64 in 0..16, labels N int), as load_digits' images and target."""
    spec = importlib.util.find_spec("sklearn")
    path = Path(spec.origin).parent / "datasets" / "data" / "digits.csv.gz" if spec and spec.origin else None
    if path is not None and path.is_file():
        data = np.loadtxt(path, delimiter=",")
        return data[:, :-1].reshape(-1, 8, 8), data[:, -1].astype(int)
    from sklearn.datasets import load_digits

    digits = load_digits()
    return digits.images, digits.target
