"""The scan's anchor pre-match (events.ANCHORS found per line in Rust) only spares
``classify`` rules that cannot fire: the events are those of trying every rule."""

from __future__ import annotations

from pathlib import Path

import pytest

from syncdoctor.doctor.ingest import core, events

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "logs"

# Lines where the anchors of the raw line and of its body part ways: a "[rankN]:"
# cut out of the middle splices the body ("ti" + "meout"), "(i/n)" rank tags are
# dropped, and Python's lower() maps the Kelvin sign to an ASCII "k".
CRAFTED = [
    "worker ti[rank3]:meout after 30s",
    "collective (2/8) ti(1/4)meout",
    "Process \u212ailled by signal 9",
    "[rank1]:[E1129 10:40:01.123456 4001 ProcessGroupNCCL.cpp:616] Watchdog caught collective operation timeout",
    "gpu-node-1:1234:1300 [0] NCCL INFO Channel 01/02 :    0   1",
    "gpu-node-1:1234:1300 [0] NCCL INFO comm 0x5581 rank 3 nranks 8 cudaDev 3 busId 1000 - Init COMPLETE",
    "checkpoint saved to /ckpt/step_12.ckpt (exit code of uploader: 0 pending)",
    "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer [127.0.0.1]:1",
    "[ERROR] HCCL(12345,python):2026-11-29-10:05:01.123.456 [hccl.cc:778] wait socket establish timeout, rank[3]",
]


def _events(path: Path) -> list[tuple[object, ...]]:
    return [(e.kind, e.line, e.rank, e.host, e.benign, e.raw) for e in core.ingest_logs([path]).events]


@pytest.mark.parametrize("path", sorted(FIXTURES.rglob("*.log")), ids=lambda p: p.name)
def test_anchor_prematch_keeps_the_events_of_a_fixture(path, monkeypatch):
    with_anchors = _events(path)
    monkeypatch.setattr(events, "ANCHORS", ())  # the scan reports none: every rule tried
    assert _events(path) == with_anchors


def test_anchor_prematch_keeps_the_events_of_spliced_and_unicode_lines(tmp_path, monkeypatch):
    path = tmp_path / "crafted.log"
    path.write_text("\n".join(CRAFTED * 3) + "\n", encoding="utf-8")
    with_anchors = _events(path)
    assert len(with_anchors) >= 5
    monkeypatch.setattr(events, "ANCHORS", ())
    assert _events(path) == with_anchors


def test_classify_with_anchors_tries_only_rules_that_can_fire():
    body = "gpu-node-1:1234:1300 [0] NCCL INFO Channel 01/02 :    0   1"
    low = body.lower()
    found = [a for a in events.ANCHORS if a in low]
    assert events.classify(body, low, found) == events.classify(body, low)
    assert events.classify(body, low, []) is None  # no anchor: no rule is tried
