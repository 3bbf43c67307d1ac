"""A stand-in rank for the fork server's tests: prints what a rank would see of its own
process as one JSON line, then exits as its arguments say (`exit N`, `raise`, `sleep S`)."""

from __future__ import annotations

import json
import os
import random
import signal
import sys
import time

import numpy as np
import torch

print(
    json.dumps(
        {
            "argv": sys.argv[1:],
            "pid": os.getpid(),
            "pgid": os.getpgid(0),
            "sid": os.getsid(0),
            "env": os.environ.get("FORKED_RANK_TAG"),
            "name": __name__,
            "torch_seed": torch.initial_seed(),
            "numpy": int(np.random.randint(1 << 30)),
            "random": random.random(),
            "sigint_raises": signal.getsignal(signal.SIGINT) is signal.default_int_handler,
            "sigterm_default": signal.getsignal(signal.SIGTERM) is signal.SIG_DFL,
        }
    ),
    flush=True,
)
what, arg = sys.argv[1], sys.argv[2]
if what == "exit":
    sys.exit(int(arg))
if what == "raise":
    raise RuntimeError(arg)
if what == "sleep":
    time.sleep(float(arg))
