"""Small hand-written record folders (seconds, no training): `write_run` builds them
(the SD406 and SD904 fixtures under tests/rules/ were written with it), and what the
diagnosis does with a rank the probe stopped watching."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from syncdoctor.doctor.diagnose import diagnose


def write_run(
    root: Path, snapshots: list[dict[str, Any]], steps: int = 20, step_fields: dict[int, dict[str, Any]] | None = None
) -> Path:
    records = root / "records"
    records.mkdir(parents=True)
    for rank, extra in enumerate(snapshots):
        snap = {
            "v": 1,
            "kind": "snapshot",
            "rank": rank,
            "world_size": len(snapshots),
            "framework": "torch",
            "host": "node0",
            "env": {"RANK": str(rank)},
            "loss": {"type": "CrossEntropyLoss", "params": {}},
            "optimizer": {"type": "SGD", "param_groups": [{"lr": 0.1}]},
            "ddp": {"wrapper": "FSDPNet"},
            "init_param_fp": 11,
            "init_param_fp_before_update": True,
            **extra,
        }
        lines = [snap]
        for step in range(1, steps + 1):
            rec = {
                "v": 1,
                "kind": "step",
                "rank": rank,
                "step": step,
                "micro": 1,
                "backward": step,
                "opt_steps": step,
                "t": 1000.0 + step,
                "loss": 2.0 / step,
                "lr": 0.1,
                "param_fp": 5 + step,
                "train_mode": "3/3",
                **(step_fields or {}).get(rank, {}),
            }
            lines.append(rec)
        lines.append(
            {
                "v": 1,
                "kind": "check",
                "rank": rank,
                "step": steps,
                "status": "ok",
                "what": [],
                "ranks": [],
                "tensor": None,
                "detail": {"first_step": 1, "checks": 4},
            }
        )
        lines.append({"v": 1, "kind": "end", "rank": rank, "step": steps, "t": 2000.0, "status": "ok", "message": ""})
        (records / f"rank{rank}.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    return root


def test_probe_disabled_on_a_rank_is_never_healthy(tmp_path: Path) -> None:
    run = write_run(tmp_path / "off", [{}, {}])
    with (run / "records" / "rank1.jsonl").open("a") as fh:
        fh.write(
            json.dumps(
                {
                    "v": 1,
                    "kind": "event",
                    "rank": 1,
                    "t": 1001.0,
                    "step": 0,
                    "event": "exception",
                    "message": "probe disabled: RuntimeError: .numpy() is not supported",
                }
            )
            + "\n"
        )
    diag = diagnose([run])
    assert diag.verdict == "inconclusive"
    assert "probe disabled itself on 1 of 2 ranks" in diag.warnings[0]


def test_sd402_rhythm_tie_is_the_same_on_every_run() -> None:
    """Two micro-step counts equally usual (two ranks, no majority): polars' mode()
    returns both in any order, which once made SD402 name rank 0 on some runs and
    rank 1 on others. The smaller count is taken as the usual one, every time."""
    from types import SimpleNamespace

    import polars as pl

    from syncdoctor.doctor.rules.sd402_step_misalignment import StepMisalignment

    steps = pl.DataFrame({"rank": [0, 1] * 3, "step": [1, 1, 2, 2, 3, 3], "micro": [2, 1, 2, 1, 2, 1]})
    ev = SimpleNamespace(has_records=True, steps=steps)
    assert {tuple(StepMisalignment._off_their_rhythm(ev, 1)) for _ in range(40)} == {(0,)}  # type: ignore[arg-type]
