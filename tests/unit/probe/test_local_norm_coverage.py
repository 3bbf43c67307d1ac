"""The local gradient norm is recorded beside the reduced one only where both cover
the same tensors. A gradient that arrives outside backward (FSDP2's reduce-scatter
writes the sharded parameters' gradients directly) is not seen locally: a ratio of
the whole reduced norm to the few tensors seen would read as a summed reduce."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

JOB = """
import os, socket, sys, torch, torch.distributed as dist
import syncdoctor
with socket.socket() as s:
    s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
for how in ("backward", "outside"):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 1))
    model.register_parameter("scale", torch.nn.Parameter(torch.ones(())))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    probe = syncdoctor.attach(model, opt, run_dir=os.path.join(sys.argv[1], how), check_every=1)
    for step in range(2):
        loss = (model(torch.randn(8, 4)) * (model.scale if how == "backward" else 1.0)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        if how == "outside":
            model.scale.grad = torch.ones(())  # written outside backward, as a reduce-scatter writes it
        opt.step()
    probe.close()
dist.destroy_process_group()
"""


def _first_detailed_steps(tmp_path: Path) -> dict[str, dict[str, object]]:
    subprocess.run([sys.executable, "-c", JOB, str(tmp_path)], check=True, timeout=300, capture_output=True)
    firsts = {}
    for how in ("backward", "outside"):
        lines = (tmp_path / how / "records" / "rank0.jsonl").read_text().splitlines()
        rows = [json.loads(line) for line in lines]
        firsts[how] = next(r for r in rows if r.get("kind") == "step" and r.get("grad_norm") is not None)
    return firsts


def test_the_local_norm_is_left_out_where_a_gradient_arrived_outside_backward(tmp_path: Path) -> None:
    firsts = _first_detailed_steps(tmp_path)
    assert firsts["backward"]["grad_norm_local"] is not None and firsts["backward"]["reduce_ratio"] is not None
    assert firsts["outside"]["grad_norm"] is not None
    assert "grad_norm_local" not in firsts["outside"] and "reduce_ratio" not in firsts["outside"]
