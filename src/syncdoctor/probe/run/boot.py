"""Start-up half of zero-code mode (`syncdoctor run`), imported by the generated
sitecustomize in every Python process the command starts.

It must cost nothing in processes that never train (the launcher, helpers, tools
the script shells out to), so it imports neither torch nor numpy: it only
- tees this process's stdout and stderr into RUN_DIR/logs/rank{R}.log once the
  process is known to be a rank (probe/core/process.py), and
- installs a meta-path finder that applies the framework patches right after
  `torch` (or MindSpore's `Model`) finishes importing (syncdoctor.probe.torch.attach).
"""

from __future__ import annotations

import atexit
import os
import sys

from syncdoctor.probe.core.process import (
    become_rank,
    is_torch_launcher,
    launcher_rank,
    note_process,
    run_dir,
    stop_tee,
    when_imported,
)
from syncdoctor.settings import DISABLE_ENV, PLUGINS_ENV


def _install_torch() -> None:
    note_process("torch")
    if is_torch_launcher():
        return
    from syncdoctor.probe.torch import attach as auto

    auto.install()


def _install_mindspore() -> None:
    from syncdoctor.probe.mindspore import attach

    note_process("mindspore")
    attach.install_autoattach()  # reads the run folder and K from the environment


def _load_plugins() -> None:
    """The modules named in PLUGINS_ENV register on the probe's hook points as they are
    imported. Only syncdoctor's own modules are taken (the environment names one, it
    does not bring code of its own); one that cannot be imported is said once, and the
    run goes on without it."""
    import importlib

    for name in filter(None, (n.strip() for n in os.environ.get(PLUGINS_ENV, "").split(","))):
        try:
            if not name.startswith("syncdoctor."):
                raise ValueError("only syncdoctor's own modules are loaded")
            importlib.import_module(name)
        except Exception as exc:
            print(f"syncdoctor: plugin {name} not loaded: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)


def install() -> None:
    """Entry point of the generated sitecustomize."""
    if not run_dir() or os.environ.get(DISABLE_ENV):
        return
    rank = launcher_rank()
    if rank is not None:
        become_rank(rank)
    atexit.register(stop_tee)  # registered first, so it runs after the probe's own atexit close
    _load_plugins()
    when_imported("torch", _install_torch)
    when_imported("mindspore.train.model", _install_mindspore)
