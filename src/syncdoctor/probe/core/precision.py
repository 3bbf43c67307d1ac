"""Whether gradients hold float16 values, for both probes (framework-free): each
probe passes how to read a tensor's dtype name and a sample of its values."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

FP16_SAMPLE = 256  # values per gradient tensor looked at


def fp16_exact(
    grads: Iterable[Any], dtype_name: Callable[[Any], str], sample: Callable[[Any, int], np.ndarray]
) -> bool | None:
    """Whether the gradients hold float16 values (they were computed or reduced in
    fp16, e.g. fp16 training or fp16 gradient compression). A sample of each tensor
    suffices: a float32 gradient value is fp16-representable with odds of ~2^-13.
    None: not float32 (bfloat16, float64), or too few nonzero values to tell."""
    seen = 0
    for g in grads:
        kind = dtype_name(g)
        if kind == "float16":
            return True
        if kind != "float32":
            return None
        values = sample(g, FP16_SAMPLE)
        if not np.array_equal(values.astype(np.float16).astype(np.float32), values):
            return False  # the usual answer, after the first tensor
        seen += int(np.count_nonzero(values))  # zeros are exact in any precision: they prove nothing
    return True if seen >= 64 else None
