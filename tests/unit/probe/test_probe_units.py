"""Unit tests of the probe's pieces: fingerprints, the cross-rank comparison, the
mismatch message, the evidence helpers and the record writer."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from syncdoctor.probe.core.compare import (
    FIELDS,
    compare,
    config_fingerprint,
    group_bounds,
    tensor_groups,
)
from syncdoctor.probe.core.evidence import log_tail, snapshot_differences
from syncdoctor.probe.core.fingerprint import combine
from syncdoctor.probe.core.verdict import mismatch_message
from syncdoctor.probe.torch.fingerprint import fingerprints, ids_fingerprint, tensor_fingerprint
from syncdoctor.records import read_run
from syncdoctor.records.compare import agreement, describe_split, majority_outliers
from syncdoctor.records.writer import RecordWriter

BOTH_PATHS = pytest.mark.parametrize("device_path", [False, True], ids=["xxh3", "device"])


def _fp(t: torch.Tensor, device_path: bool) -> int:
    return fingerprints([t], device_path=device_path)[0]


def _one_ulp(t: torch.Tensor, index: int) -> torch.Tensor:
    out = t.clone()
    flat = out.view(-1)
    flat[index] = torch.nextafter(flat[index], torch.tensor(math.inf, dtype=t.dtype))
    return out


@BOTH_PATHS
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
def test_one_ulp_change_of_any_element_changes_the_fingerprint(dtype: torch.dtype, device_path: bool) -> None:
    t = (torch.randn(3001, generator=torch.Generator().manual_seed(0)) * 1e-6).to(dtype)  # tiny values
    base = _fp(t, device_path)
    for index in (0, 1, 1023, 1024, 2047, 3000):
        assert _fp(_one_ulp(t, index), device_path) != base, index


@settings(max_examples=40, deadline=None)
@given(n=st.integers(2, 5000), data=st.data())
def test_single_element_ulp_property(n: int, data: st.DataObject) -> None:
    t = torch.randn(n, generator=torch.Generator().manual_seed(n))
    index = data.draw(st.integers(0, n - 1))
    for device_path in (False, True):
        assert _fp(_one_ulp(t, index), device_path) != _fp(t, device_path)


@BOTH_PATHS
def test_swaps_and_flips_change_the_fingerprint(device_path: bool) -> None:
    t = torch.randn(64, 8, 3, 3, generator=torch.Generator().manual_seed(1))
    base = _fp(t, device_path)
    swapped = t.clone().view(-1)
    swapped[[5, 4000]] = swapped[[4000, 5]]
    assert _fp(swapped.view_as(t), device_path) != base
    assert _fp(t.flip(1), device_path) != base  # flipped channels: same multiset of values
    rows = t.clone().view(-1)
    rows[:1024], rows[1024:2048] = t.view(-1)[1024:2048].clone(), t.view(-1)[:1024].clone()
    assert _fp(rows.view_as(t), device_path) != base  # two whole rows of the device path's matrix
    assert _fp(t.clone(), device_path) == base


@BOTH_PATHS
def test_fingerprints_handle_none_views_and_empty(device_path: bool) -> None:
    t = torch.arange(24, dtype=torch.float32).view(4, 6)
    fps = fingerprints([None, t, t.t(), torch.empty(0)], device_path=device_path)
    assert fps[0] == 0
    assert fps[1] != fps[2]  # the transposed view is hashed in its own (logical) order
    assert all(isinstance(v, int) and -(2**63) <= v < 2**63 for v in fps)


def test_combine_is_order_sensitive_and_ids_fingerprint_accepts_lists() -> None:
    a, b = tensor_fingerprint(torch.ones(3)), tensor_fingerprint(torch.zeros(3))
    assert combine([a, b]) != combine([b, a])
    assert combine([]) == 0
    assert ids_fingerprint([1, 2, 3]) == ids_fingerprint(np.array([1, 2, 3]))
    assert ids_fingerprint([1, 2, 3]) != ids_fingerprint([1, 3, 2])


def _table(rows: list[dict[str, int]]) -> list[list[int]]:
    base = {f: 7 for f in FIELDS}
    return [[{**base, "data_fp": 100 + r, **row}.get(f, 0) for f in FIELDS] for r, row in enumerate(rows)]


def test_compare_names_what_differs_and_the_minority_ranks() -> None:
    assert compare(_table([{}, {}, {}]), True) == ([], [])
    what, ranks = compare(_table([{}, {}, {"param_fp": 1, "micro": 2}, {}]), True)
    assert set(what) == {"param", "counter"} and ranks == [2]
    assert compare(_table([{}, {"buffer_fp": 3}]), False) == ([], [])  # not compared without DDP
    # Two ranks that disagree: no majority, so neither is named the odd one; both are.
    assert compare(_table([{}, {"buffer_fp": 3}]), True) == (["buffer"], [0, 1])
    assert compare(_table([{}, {"config_fp": 3}, {}]), True) == (["config"], [1])
    assert compare(_table([{}, {"config_fp": 3}, {"config_fp": 3}, {}]), True) == (["config"], [0, 1, 2, 3])
    what, ranks = compare(_table([{"data_fp": 5}, {"data_fp": 5}, {"data_fp": 6}]), True)
    assert what == ["data"] and ranks == [0, 1]  # two ranks trained on the same batch


@pytest.mark.parametrize("n", [1, 7, 64, 65, 161, 1000])
def test_tensor_groups_cover_every_tensor_and_move_only_the_changed_group(n: int) -> None:
    bounds = group_bounds(n)
    assert bounds[0][0] == 0 and bounds[-1][1] == n and len(bounds) == min(n, 64)
    assert all(a < b and b == c for (a, b), (c, _) in zip(bounds, bounds[1:], strict=False))
    fps = list(range(100, 100 + n))
    for changed in {0, n // 2, n - 1}:
        other = fps.copy()
        other[changed] += 1
        differing = [g for g, (x, y) in enumerate(zip(tensor_groups(fps), tensor_groups(other), strict=True)) if x != y]
        assert len(differing) == 1 and bounds[differing[0]][0] <= changed < bounds[differing[0]][1]


def test_a_culprit_is_named_only_under_a_strict_majority() -> None:
    assert majority_outliers(dict(enumerate([1, 2]))) == [0, 1]  # two ranks: no majority
    assert majority_outliers(dict(enumerate([1, 2, 2]))) == [0]
    assert majority_outliers(dict(enumerate([1, 1, 2, 2]))) == [0, 1, 2, 3]  # a 2-2 split
    assert majority_outliers(dict(enumerate([4, 4, 4, 4]))) == []
    split = agreement(dict(enumerate([7, 7, 9, 7])))
    assert split.has_majority and split.reference == 7 and split.odd == [2] and split.majority == [0, 1, 3]
    assert not agreement({0: 1, 1: 2}).has_majority


def test_describe_split_puts_values_side_by_side() -> None:
    assert describe_split({0: 0.05, 1: 0.0001}) == "0.05 (rank 0) vs 0.0001 (rank 1)"
    assert describe_split({0: 1, 1: 2, 2: 1}) == "1 (ranks 0, 2) vs 2 (rank 1)"


def test_mismatch_message_has_the_documented_shape() -> None:
    msg = mismatch_message(1200, ["counter", "param", "opt"], [0, 1], "layer3.1.conv2.weight", 2)
    assert msg.startswith(
        "GRADIENT_SYNC: rank 0 and rank 1 parameter mismatch at step 1200 (first: layer3.1.conv2.weight)"
    )
    assert "also differ: optimizer state, step counter" in msg
    assert msg.endswith("no majority to tell which side is odd (a third replica or a recomputation would)")
    msg = mismatch_message(5, ["counter"], [3], None, 4)
    assert msg.startswith("GRADIENT_SYNC: rank 0 and rank 3 step counter mismatch at step 5;")
    assert msg.endswith("odd one out: [3] (the other 3 ranks agree)")


def test_config_fingerprint_ignores_the_loader_and_sees_hyperparameters() -> None:
    snap = {"loss": {"type": "ASL", "params": {"margin": 0.05}}, "optimizer": {"type": "SGD"}, "loader": {"rank": 0}}
    assert config_fingerprint(snap) == config_fingerprint({**snap, "loader": {"rank": 1}})
    assert config_fingerprint(snap) != config_fingerprint({**snap, "loss": {"type": "ASL", "params": {"margin": 0.1}}})


def test_snapshot_differences_skip_what_differs_by_design() -> None:
    snaps = {
        r: {
            "rank": r,
            "pid": 100 + r,
            "env": {"RANK": str(r), "NCCL_ALGO": "Ring" if r else "Tree"},
            "loss": {"params": {"margin": 0.05 * (1 + r)}},
            "versions": {"torch": "2.13"},
        }
        for r in range(2)
    }
    diffs = snapshot_differences(snaps)
    assert set(diffs) == {"env.NCCL_ALGO", "loss.params.margin"}
    assert diffs["loss.params.margin"] == {0: 0.05, 1: 0.1}


def test_log_tail(tmp_path) -> None:  # type: ignore[no-untyped-def]
    log = tmp_path / "rank0.log"
    log.write_text("".join(f"line {i}\n" for i in range(200)))
    assert log_tail(log, 3) == ["line 197", "line 198", "line 199"]
    assert log_tail(tmp_path / "missing.log") == []


def test_writer_keeps_non_finite_values_visible_and_reader_drops_a_truncated_line(tmp_path) -> None:  # type: ignore[no-untyped-def]
    writer = RecordWriter(tmp_path, 0)
    writer.write("step", rank=0, step=1, loss=float("nan"), grad_norm=float("inf"), tensor_norms=[1.0, float("-inf")])
    writer.write("step", rank=0, step=2, loss=0.5)
    writer.close()
    path = tmp_path / "records" / "rank0.jsonl"
    first = json.loads(path.read_text().splitlines()[0])
    assert first["loss"] is None and first["nonfinite"] == {"loss": "nan", "grad_norm": "inf"}
    assert first["tensor_norms"] == [1.0, None]
    with open(path, "ab") as fh:
        fh.write(b'{"v":1,"kind":"step","rank":0,"st')  # killed mid-record
    run = read_run(tmp_path)
    assert run.steps["step"].to_list() == [1, 2]
    assert any("truncated" in w for w in run.warnings)


def test_writer_never_raises_on_an_unwritable_folder(tmp_path) -> None:  # type: ignore[no-untyped-def]
    blocker = tmp_path / "file"
    blocker.write_text("")
    writer = RecordWriter(blocker, 0)  # records/ cannot be created under a file
    writer.write("step", rank=0, step=1)
    assert writer.failed


def test_duplicate_data_is_reported_as_identical_batches_not_a_mismatch() -> None:
    msg = mismatch_message(3, ["data"], [0, 1], None, 2)
    assert msg.startswith("GRADIENT_SYNC: rank 0 and rank 1 consumed identical batches at step 3")
    assert "mismatch" not in msg
