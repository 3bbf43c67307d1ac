"""The torch and the MindSpore probe behave alike where a user can tell: the same
defaults and environment variables (syncdoctor/settings.py), the same verdict line and
evidence bundle (probe/core/verdict.py, probe/core/evidence.py) and the same exception. The
MindSpore probe's class imports without MindSpore (it loads it when it measures), so
its reporting runs here; its checks over real ranks are in tests/mindspore/."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from syncdoctor import settings
from syncdoctor.probe.mindspore.probe import MindSporeProbe
from syncdoctor.probe.torch.probe import NullProbe, Probe, attach
from syncdoctor.records.writer import RecordWriter


def _torch_probe(tmp_path: Path, **kwargs: object) -> Probe:
    model = torch.nn.Linear(2, 1)
    return Probe(model, torch.optim.SGD(model.parameters(), lr=0.1), tmp_path / "torch", **kwargs)  # type: ignore[arg-type]


def test_same_defaults(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (settings.ON_MISMATCH_ENV, settings.CHECK_EVERY_ENV, settings.DISABLE_ENV):
        monkeypatch.delenv(name, raising=False)
    torch_probe, ms_probe = _torch_probe(tmp_path), MindSporeProbe(None, enabled=False, run_dir=tmp_path / "ms")
    assert (torch_probe.on_mismatch, torch_probe.check_every) == (ms_probe.on_mismatch, ms_probe.check_every)
    assert (ms_probe.on_mismatch, ms_probe.check_every) == ("warn", settings.DEFAULT_CHECK_EVERY)
    torch_probe.close()


def test_same_environment_variables(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(settings.ON_MISMATCH_ENV, "dump")
    monkeypatch.setenv(settings.CHECK_EVERY_ENV, "7")
    torch_probe, ms_probe = _torch_probe(tmp_path), MindSporeProbe(None, enabled=False, run_dir=tmp_path / "ms")
    assert (
        (torch_probe.on_mismatch, torch_probe.check_every)
        == (ms_probe.on_mismatch, ms_probe.check_every)
        == ("dump", 7)
    )
    torch_probe.close()
    monkeypatch.setenv(settings.ON_MISMATCH_ENV, "explode")
    for make in (lambda: _torch_probe(tmp_path), lambda: MindSporeProbe(None, enabled=False)):
        with pytest.raises(ValueError, match="on_mismatch must be one of warn, dump, raise, heal, not 'explode'"):
            make()
    monkeypatch.delenv(settings.ON_MISMATCH_ENV)
    monkeypatch.setenv(settings.DISABLE_ENV, "1")
    assert isinstance(attach(torch.nn.Linear(2, 1)), NullProbe)
    assert not MindSporeProbe(None, run_dir=tmp_path / "off").enabled
    assert not (tmp_path / "off").exists()


def _ms_probe_at_a_check(tmp_path: Path, on_mismatch: str) -> MindSporeProbe:
    """A MindSpore probe of rank 1 of 3 at step 20, as a check finds it (no MindSpore needed)."""
    probe = MindSporeProbe(None, enabled=False, run_dir=tmp_path, on_mismatch=on_mismatch)
    probe.enabled, probe.rank, probe.world_size, probe.step = True, 1, 3, 20
    probe.writer = RecordWriter(tmp_path, 1)
    probe._recent_losses.extend([(19, 0.5), (20, 0.25)])
    return probe


def test_mindspore_verdict_line_evidence_and_exception(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    detail = {"step": [20, 20, 20], "param_fp": [5, 6, 5], "mode": [1, 1, 1]}
    probe = _ms_probe_at_a_check(tmp_path, "raise")
    with pytest.raises(settings.SyncMismatchError) as raised:
        probe._report(["param"], [1], "fc.weight", detail)
    line = "GRADIENT_SYNC: rank 0 and rank 1 parameter mismatch at step 20 (first: fc.weight)"
    assert str(raised.value).startswith(line)  # the torch probe's format (probe/core/verdict.py)
    assert f"syncdoctor: [ERROR] {line}" in capsys.readouterr().err
    bundle = json.loads((tmp_path / "evidence" / "step20.rank1.json").read_text())
    assert bundle["per_rank"] == detail and bundle["tensor"] == "fc.weight"
    assert bundle["last_losses"] == [[19, 0.5], [20, 0.25]]

    warned = _ms_probe_at_a_check(tmp_path / "warn", "warn")
    warned._report(["param"], [1], "fc.weight", detail)  # warns, no bundle, no exception
    assert not (tmp_path / "warn" / "evidence").exists()


def test_mindspore_raise_reaches_the_training_loop(tmp_path: Path) -> None:
    """on_mismatch='raise' stops training; any other failure of the probe never does."""
    probe = _ms_probe_at_a_check(tmp_path, "raise")

    def mismatch(*args: object) -> None:
        raise settings.SyncMismatchError("GRADIENT_SYNC: ...")

    def broken(*args: object) -> None:
        raise RuntimeError("a probe bug")

    probe._after_step = mismatch  # type: ignore[method-assign]
    with pytest.raises(settings.SyncMismatchError):
        probe.after_step(loss=0.5)
    probe._after_step = broken  # type: ignore[method-assign]
    probe.after_step(loss=0.5)
    probe.writer.close()  # type: ignore[union-attr]
    events = [json.loads(line) for line in (tmp_path / "records" / "rank1.jsonl").read_text().splitlines()]
    assert any(e.get("event") == "exception" and "a probe bug" in e["message"] for e in events)
