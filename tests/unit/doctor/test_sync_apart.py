"""Where the ranks' sync schedules first part (doctor/evidence/reduce.py sync_apart):
the first check step where two ranks' schedules hold different flags at the same call;
steps where they differ only in length (one rank made more calls, all alike) or where
every rank's schedule is the same are passed over."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from syncdoctor.doctor.diagnose import load_evidence

SCHEDULES = {  # check step -> each rank's schedule (None: not recorded)
    10: ["s", "s", "s"],
    20: ["s", "s", "ss"],  # a longer schedule, alike where both have calls
    30: [None, "s", "s"],  # rank 0 ran one micro-step: one synchronised call
    40: ["s", "ns", "s"],  # rank 1's first call ran under no_sync
    50: ["ns", "s", "s"],
}


def _write(root: Path) -> Path:
    records = root / "records"
    records.mkdir(parents=True)
    for rank in range(3):
        lines = [{"v": 1, "kind": "snapshot", "rank": rank, "world_size": 3, "framework": "torch"}]
        for step in range(1, 51):
            rec: dict[str, Any] = {"v": 1, "kind": "step", "rank": rank, "step": step, "micro": 1, "backward": step}
            if step in SCHEDULES:
                rec.update(param_fp=7, syncs=SCHEDULES[step][rank])
                if rec["syncs"] is not None:
                    rec["micro"] = len(rec["syncs"])
            lines.append(rec)
        (records / f"rank{rank}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    return root


def test_the_schedules_part_at_the_first_check_where_a_call_differs(tmp_path: Path) -> None:
    ev = load_evidence([_write(tmp_path / "run")])
    apart = ev.reduce.sync_apart
    assert apart is not None and (apart.step, apart.call) == (40, 1)
    assert apart.synced == {0: True, 1: False, 2: True}
