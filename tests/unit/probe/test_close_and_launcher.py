"""Two start-up and end-of-job costs of the probe that a user meets once per job: the
launcher process is left unpatched, and the ranks' meetings at close wake on the
store's own wait instead of a polling interval."""

from __future__ import annotations

import sys
import threading
import time

import pytest
import torch.distributed as dist

from syncdoctor.probe.core import process
from syncdoctor.probe.torch.check import CrossRankCheck

PY = "/usr/bin/python3"


@pytest.mark.parametrize(
    ("argv", "launcher"),
    [
        ([PY, "/venv/bin/torchrun", "--nproc-per-node", "2", "train.py"], True),
        ([PY, "-m", "torch.distributed.run", "--nproc-per-node", "2", "train.py"], True),
        ([PY, "-X", "importtime", "-u", "-m", "torch.distributed.launch", "train.py"], True),
        ([PY, "-mtorch.distributed.run", "train.py"], True),
        ([PY, "train.py", "--launcher", "torchrun"], False),
        ([PY, "-m", "torch.distributed.elastic.multiprocessing", "x"], False),
        ([PY, "-c", "import torch"], False),
        ([PY, "-m", "lightning", "run", "model", "train.py"], False),
        ([PY], False),
    ],
)
def test_torchrun_is_told_from_the_ranks_by_its_command_line(
    monkeypatch: pytest.MonkeyPatch, argv: list[str], launcher: bool
) -> None:
    monkeypatch.setattr(sys, "orig_argv", argv)
    assert process.is_torch_launcher() is launcher


def _checker(store: dist.Store, world_size: int) -> CrossRankCheck:
    check = CrossRankCheck.__new__(CrossRankCheck)  # only the store and the world size are read
    check.store, check.world_size = store, world_size
    return check


def test_a_meeting_ends_when_the_last_rank_arrives() -> None:
    store = dist.HashStore()
    seen_when_done: list[int] = []

    def first() -> None:
        _checker(store, 2)._meet("finished", time.monotonic() + 60)
        seen_when_done.append(int(store.add("finished", 0)))

    waiting = threading.Thread(target=first)
    waiting.start()
    time.sleep(0.2)
    assert waiting.is_alive()  # alone, it waits
    _checker(store, 2)._meet("finished", time.monotonic() + 60)
    waiting.join(timeout=60)
    assert not waiting.is_alive() and seen_when_done == [2]


def test_a_rank_that_never_arrives_holds_the_meeting_only_until_the_deadline() -> None:
    store = dist.HashStore()
    started = time.monotonic()
    _checker(store, 2)._meet("finished", started + 0.3)
    assert time.monotonic() - started >= 0.29
    assert store.add("finished", 0) == 1
