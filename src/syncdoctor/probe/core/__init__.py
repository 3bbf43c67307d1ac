"""The probe's framework-free core: numpy and the standard library only.

What data parallelism must keep equal and how ranks are compared live here, once, for
both frameworks: the compared values and the verdict line (`verdict`), the cross-rank
compare of a gathered table (`compare`), fingerprints of numpy arrays and their
combination (`fingerprint`), which ranks must agree under a mesh (`mesh`), precision,
the common snapshot, the evidence bundle, the one fence between the probe and the
program (`safety`), and the hook points other parts register on (`hook_points`). The torch
and MindSpore adapters import from here; nothing here imports torch or MindSpore
(enforced by the import contracts in pyproject.toml).
"""
