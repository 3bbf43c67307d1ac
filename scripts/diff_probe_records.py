"""Two run folders of the same seeded job, recorded by two versions of the probe, hold
the same records: a check for changes meant to make the probe cheaper, not different.

    PYTHONPATH=/path/to/old/src syncdoctor run --out A --check-every 1 -- torchrun ... job.py
    PYTHONPATH=/path/to/new/src syncdoctor run --out B --check-every 1 -- torchrun ... job.py
    python scripts/diff_probe_records.py A B

Compared per rank file: every record, field by field, less what differs from run to run
by nature (times, timings, process ids, paths, the launcher's environment with its port,
the unseeded Python and numpy generator states of the snapshot). Records are put in
order of (kind, step) first: a check record lands in the file when its block is read,
which depends on timing, not on the probe.
Prints up to 20 differences and exits 1 when there is any.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

IGNORED = {"env", "t", "time", "wall_s", "elapsed_s", "duration_s", "pid", "waited_s", "host", "argv", "cwd", "path"}


def _strip(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _strip(v) for k, v in value.items() if k not in IGNORED}
    if isinstance(value, list):
        return [_strip(v) for v in value]
    return value


def records(folder: Path) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for path in sorted(folder.rglob("*.jsonl")):
        rows = []
        for line in path.read_text().splitlines():
            record = _strip(json.loads(line))
            if record.get("kind") == "snapshot":
                for generator in ("python", "numpy"):  # unseeded in a seeded job: differs per run
                    (record.get("rng") or {}).pop(generator, None)
            rows.append(record)
        rows.sort(
            key=lambda r: (
                r.get("kind") != "snapshot",
                str(r.get("kind")),
                r.get("step") or 0,
                json.dumps(r, sort_keys=True),
            )
        )
        out[str(path.relative_to(folder))] = rows
    return out


def differences(a: Path, b: Path) -> list[str]:
    left, right = records(a), records(b)
    found = [f"files: {sorted(left)} vs {sorted(right)}"] if left.keys() != right.keys() else []
    for name in sorted(left.keys() & right.keys()):
        if len(left[name]) != len(right[name]):
            found.append(f"{name}: {len(left[name])} vs {len(right[name])} records")
        for x, y in zip(left[name], right[name], strict=False):
            if x != y:
                fields = {k: (x.get(k), y.get(k)) for k in sorted(set(x) | set(y)) if x.get(k) != y.get(k)}
                found.append(f"{name}: {x.get('kind')} step {x.get('step')}: {fields}")
    return found


def main() -> None:
    found = differences(Path(sys.argv[1]), Path(sys.argv[2]))
    for line in found[:20]:
        print(line)
    print(f"{len(found)} difference(s)")
    sys.exit(1 if found else 0)


if __name__ == "__main__":
    main()
