from __future__ import annotations

import json
from pathlib import Path

import pytest

from syncdoctor.preflight import run_preflight
from syncdoctor.preflight.engine import PreflightInputError


def test_env_dumps_bad(fixtures: Path) -> None:
    found = {(Path(f.path).name, f.code) for f in run_preflight([fixtures / "env" / "bad"])}
    assert found == {
        ("env_rank1.txt", "PF204"),  # LOCAL_RANK 0 twice on node-a
        ("env_rank2.txt", "PF201"),  # RANK 1 twice
        ("env_rank2.txt", "PF203"),  # WORLD_SIZE 8 vs 4
        ("env_rank2.txt", "PF205"),  # MASTER_ADDR differs
        ("env_rank3.txt", "PF202"),  # device 0 twice on node-b
    }


def test_env_dumps_good(fixtures: Path) -> None:
    assert run_preflight([fixtures / "env" / "good"]) == []


def _snapshot(rank: int, env: dict[str, str], **extra: object) -> str:
    rec = {"v": 1, "kind": "snapshot", "rank": rank, "world_size": 2, "host": "h0", "env": env}
    rec.update(extra)
    return json.dumps(rec) + "\n"


def _run_dir(tmp_path: Path, envs: list[dict[str, str]], **extra: object) -> Path:
    records = tmp_path / "run" / "records"
    records.mkdir(parents=True)
    for rank, env in enumerate(envs):
        (records / f"rank{rank}.jsonl").write_text(_snapshot(rank, env, **extra) + '{"v":1,"kind":"step"')
    return tmp_path / "run"


def test_records_with_duplicate_rank_id_and_device(tmp_path: Path) -> None:
    env = {"RANK_ID": "0", "RANK_SIZE": "2", "DEVICE_ID": "3"}
    run = _run_dir(tmp_path, [env, dict(env)])
    assert sorted(f.code for f in run_preflight([run])) == ["PF201", "PF202"]


def test_records_clean(tmp_path: Path) -> None:
    run = _run_dir(
        tmp_path,
        [{"RANK_ID": "0", "RANK_SIZE": "2", "DEVICE_ID": "0"}, {"RANK_ID": "1", "RANK_SIZE": "2", "DEVICE_ID": "1"}],
    )
    assert run_preflight([run]) == []


def test_records_rank_size_against_rank_table(tmp_path: Path, fixtures: Path) -> None:
    run = _run_dir(
        tmp_path,
        [{"RANK_ID": "0", "RANK_SIZE": "2", "DEVICE_ID": "0"}, {"RANK_ID": "1", "RANK_SIZE": "2", "DEVICE_ID": "1"}],
    )
    [finding] = run_preflight([run], fixtures / "rank_tables" / "good_v1.json")
    assert finding.code == "PF107"


def test_records_code_differs_between_ranks(tmp_path: Path) -> None:
    records = tmp_path / "run" / "records"
    records.mkdir(parents=True)
    for rank, digest in enumerate(["aa" * 32, "bb" * 32]):
        code = {
            "entry": "/job/train.py",
            "entry_sha256": digest,
            "files": {"/job/train.py": digest, "/job/loss.py": "cc" * 32},
        }
        (records / f"rank{rank}.jsonl").write_text(
            _snapshot(
                rank, {"RANK": str(rank), "WORLD_SIZE": "2"}, code=code, versions={"python": "3.11.7", "torch": "2.3.0"}
            )
        )
    [finding] = run_preflight([tmp_path / "run"])
    assert finding.code == "PF402" and "train.py" in finding.message


def test_records_of_another_schema_version_are_refused(tmp_path: Path) -> None:
    records = tmp_path / "run" / "records"
    records.mkdir(parents=True)
    (records / "rank0.jsonl").write_text('{"v": 2, "kind": "snapshot", "env": {}}\n')
    with pytest.raises(PreflightInputError, match="version 2"):
        run_preflight([tmp_path / "run"])
