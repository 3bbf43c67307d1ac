"""`inject_failure.py MODULE:ATTR[,MODULE:ATTR...] SCRIPT ARGS...`: run SCRIPT (as
`python SCRIPT ARGS` would) with one of syncdoctor's hook points replaced by a function
that raises, to show that a failure inside the probe never reaches the training it
watches. Given several, rank r (torchrun's RANK) breaks the r-th (modulo their number): each rank's probe
fails at its own point while its peers' probes go on."""

from __future__ import annotations

import importlib
import os
import runpy
import sys

import torch  # noqa: F401  (under `syncdoctor run`, importing torch installs the zero-code probe)

targets, script, *args = sys.argv[1:]
each_rank = targets.split(",")
target = each_rank[int(os.environ.get("RANK", "0")) % len(each_rank)]
module_name, _, path = target.partition(":")
owner = importlib.import_module(module_name)
*parents, name = path.split(".")
for parent in parents:
    owner = getattr(owner, parent)


def broken(*_args: object, **_kwargs: object) -> None:
    raise RuntimeError(f"injected failure in {target}")


setattr(owner, name, broken)
sys.argv = [script, *args]
runpy.run_path(script, run_name="__main__")
