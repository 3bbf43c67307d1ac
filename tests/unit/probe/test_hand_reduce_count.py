"""The probe's count of updates that read unaveraged gradients in a hand-written loop
(no DDP wrapper): an update with no synchronous `dist.all_reduce` of a gradient since
the previous one counts, once the loop has shown that it reduces. One process, no
process group: the calls the patched all_reduce and backward() make are made here."""

from __future__ import annotations

from pathlib import Path

import torch

from syncdoctor.probe.torch.probe import Probe


def _loop(tmp_path: Path, reduce_at: list[bool], metric: bool = False) -> Probe:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    probe = Probe(model, opt, tmp_path, check_every=1)
    x = torch.randn(8, 4)
    for reduce in reduce_at:
        opt.zero_grad(set_to_none=True)
        loss = model(x).square().mean()
        loss.backward()
        probe.after_backward_call()
        if metric:  # a loss averaged for logging is no reduce of the gradients
            probe.after_all_reduce(loss.detach().clone())
        if reduce:
            for p in model.parameters():
                probe.after_all_reduce(p.grad)  # type: ignore[arg-type]
        opt.step()
    probe.close()
    return probe


def test_an_update_without_its_all_reduce_counts_once_the_loop_has_reduced(tmp_path: Path) -> None:
    probe = _loop(tmp_path, [True, True, False, True, False, True])
    assert (probe._unsynced_updates, probe._unsynced_first) == (2, 3)


def test_updates_before_the_first_reducing_one_are_not_counted(tmp_path: Path) -> None:
    probe = _loop(tmp_path, [False, True, True, False])
    assert (probe._unsynced_updates, probe._unsynced_first) == (1, 4)


def test_a_loop_that_never_reduces_a_gradient_counts_none(tmp_path: Path) -> None:
    """FSDP2, another comm library, a flat buffer: only a metric reaches all_reduce."""
    probe = _loop(tmp_path, [False] * 5, metric=True)
    assert probe._unsynced_updates == 0


def test_a_metric_all_reduce_does_not_stand_for_the_gradients(tmp_path: Path) -> None:
    probe = _loop(tmp_path, [True, False, True], metric=True)
    assert (probe._unsynced_updates, probe._unsynced_first) == (1, 2)
