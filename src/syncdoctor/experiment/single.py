"""The single-rank baseline: the user's launcher command rewritten to start one process.

Each launcher names the number of processes its own way; only the launcher's own
options are touched (those before the training script or program), never the
script's. A launcher this module does not know, or one whose process count comes
from somewhere it cannot see, gets a reason instead of a command.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Launcher:
    name: str
    # Options set to "1" (every spelling); the first is inserted when none is given
    # and `insert` is true (the launcher's default would start more than one).
    count: tuple[str, ...]
    insert: bool
    # Options that multiply into the world size with `count` (nodes).
    factors: tuple[str, ...] = ()
    # Options dropped with their value, and flags dropped alone: where to find other
    # nodes, which node this is, "use every GPU".
    drop_valued: tuple[str, ...] = ()
    drop_flags: tuple[str, ...] = ()
    flags: tuple[str, ...] = ()  # options of the launcher that take no value
    add: tuple[str, ...] = ()  # flags added after the rewrite
    set_to_one: tuple[str, ...] = ()  # other counts (nodes) set to 1 when present
    no_count: str = ""  # why the world size cannot be told when `count` is absent


def _both(*names: str) -> tuple[str, ...]:
    """Each option as written with underscores and with dashes (torchrun takes both)."""
    out: list[str] = []
    for n in names:
        for spelling in (n, n.replace("_", "-"), n.replace("-", "_")):
            if spelling not in out:
                out.append(spelling)
    return tuple(out)


TORCHRUN = Launcher(
    "torchrun",
    count=_both("--nproc_per_node"),
    insert=False,  # torchrun's default is one process per node
    factors=_both("--nnodes"),
    drop_valued=_both(
        "--node_rank", "--master_addr", "--master_port", "--rdzv_endpoint", "--rdzv_backend", "--rdzv_id", "--rdzv_conf"
    ),
    flags=(*_both("--standalone", "--no_python", "--run_path", "--module"), "-m", "--use-env", "--use_env"),
    add=("--standalone",),
    set_to_one=_both("--nnodes"),
)
ACCELERATE = Launcher(
    "accelerate launch",
    count=_both("--num_processes"),
    insert=True,
    factors=_both("--num_machines"),
    drop_valued=_both("--machine_rank", "--main_process_ip", "--main_process_port", "--gpu_ids"),
    drop_flags=_both("--multi_gpu"),
    flags=(*_both("--multi_gpu", "--cpu", "--use_deepspeed", "--use_fsdp", "--debug", "--no_python", "--module"), "-m"),
    set_to_one=_both("--num_machines"),
    no_count="--num_processes not given: the count comes from accelerate's config file",
)
LAB = Launcher(
    "syncdoctor lab run",
    count=("--world-size",),
    insert=True,
    flags=("--no-probe",),
)
MSRUN = Launcher(
    "msrun",
    count=_both("--worker_num", "--local_worker_num"),
    insert=False,
    drop_valued=_both("--master_addr", "--master_port", "--node_rank"),
    flags=("--join", "--sim_level"),
    no_count="--worker_num not given",
)
MPIRUN = Launcher(
    "mpirun",
    count=("-np", "-n", "--np", "-c"),
    insert=True,
    drop_valued=(
        "-H",
        "--host",
        "-host",
        "-hostfile",
        "--hostfile",
        "-machinefile",
        "--machinefile",
        "-N",
        "-npernode",
    ),
    flags=("--oversubscribe", "-oversubscribe", "--allow-run-as-root", "--tag-output", "-tag-output", "-v"),
    no_count="no -np/-n given: the count comes from the host list or the scheduler",
)
DEEPSPEED = Launcher(
    "deepspeed",
    count=_both("--num_gpus"),
    insert=True,
    factors=_both("--num_nodes"),
    drop_valued=("-H", *_both("--hostfile", "--master_addr", "--master_port", "--include", "--exclude", "-i", "-e")),
    flags=_both("--no_python", "--module", "--no_local_rank", "--autotuning"),
    set_to_one=_both("--num_nodes"),
    no_count="--num_gpus not given: deepspeed starts one process per visible GPU",
)

_PYTHON = re.compile(r"^python(\d+(\.\d+)?)?$")


@dataclass
class SingleRank:
    command: list[str] | None  # None: not applied
    world_size: int | None = None  # the control's, as the command states it
    launcher: str = ""
    why: str = ""  # not applied: why
    changes: list[str] = field(default_factory=list)


def _find(command: list[str]) -> tuple[Launcher, int] | None:
    """The launcher and the index where its own options start."""
    for i, token in enumerate(command):
        base = os.path.basename(token)
        rest = command[i + 1 :]
        if base == "torchrun":
            return TORCHRUN, i + 1
        if base == "accelerate" and rest[:1] == ["launch"]:
            return ACCELERATE, i + 2
        if base == "msrun":
            return MSRUN, i + 1
        if base in ("mpirun", "mpiexec", "orterun"):
            return MPIRUN, i + 1
        if base == "deepspeed":
            return DEEPSPEED, i + 1
        if base == "syncdoctor" and rest[:2] == ["lab", "run"]:
            return LAB, i + 3
        if _PYTHON.match(base) and rest[:1] == ["-m"] and len(rest) > 1:
            module = rest[1]
            if module in ("torch.distributed.run", "torch.distributed.launch"):
                return TORCHRUN, i + 3
            if module in ("syncdoctor", "syncdoctor.cli") and rest[2:4] == ["lab", "run"]:
                return LAB, i + 5
            if module == "accelerate.commands.launch":
                return ACCELERATE, i + 3
            if module == "deepspeed.launcher.runner":
                return DEEPSPEED, i + 3
            return None
    return None


def _options_end(launcher: Launcher, args: list[str]) -> int:
    """Index of the first token that is the program (or script), not the launcher's."""
    if launcher is LAB:
        return len(args)  # `lab run FAULT [options]`: every option is the lab's
    i = 0
    valued = {*launcher.count, *launcher.factors, *launcher.drop_valued}
    while i < len(args):
        token = args[i]
        if token == "--":
            return i
        if not token.startswith("-"):
            return i
        if "=" in token or token in launcher.flags:
            i += 1
        elif token in valued or (i + 1 < len(args) and args[i + 1].startswith("-") is False and token.startswith("--")):
            # An option we do not know takes a value when a non-option follows it,
            # unless that non-option is the script itself.
            if token not in valued and args[i + 1].endswith(".py"):
                i += 1
            else:
                i += 2
        else:
            i += 1
    return i


def _value(args: list[str], names: tuple[str, ...]) -> str | None:
    for i, token in enumerate(args):
        for name in names:
            if token == name and i + 1 < len(args):
                return args[i + 1]
            if token.startswith(name + "="):
                return token.split("=", 1)[1]
    return None


def _count(text: str | None) -> int | None:
    if text is None:
        return None
    text = text.split(":")[-1]  # torchrun --nnodes MIN:MAX
    return int(text) if text.isdigit() else None


def single_rank(command: list[str]) -> SingleRank:
    """`command` rewritten to start one process, or why that cannot be done."""
    found = _find(command)
    if found is None:
        return SingleRank(None, why="cannot tell how this launcher sets the number of processes")
    launcher, start = found
    head, rest = command[:start], command[start:]
    end = _options_end(launcher, rest)
    own, program = rest[:end], rest[end:]
    count_text = _value(own, launcher.count)
    count = _count(count_text)
    if count_text is None:
        if launcher is TORCHRUN:
            count = 1
        elif launcher is LAB:
            count = 2  # the lab's default world size
    if count_text is not None and count is None:
        return SingleRank(None, launcher=launcher.name, why=f"the process count {count_text!r} is not a number")
    world = count
    for name in launcher.factors:
        factor = _count(_value(own, (name,)))
        if factor and world:
            world *= factor
    out: list[str] = []
    changes: list[str] = []
    i = 0
    seen_count = False
    while i < len(own):
        token = own[i]
        name = token.split("=", 1)[0]
        has_inline = "=" in token
        if name in launcher.count or name in launcher.set_to_one:
            seen_count |= name in launcher.count
            out += [f"{name}=1"] if has_inline else [name, "1"]
            changes.append(f"{name} 1")
            i += 1 if has_inline else 2
        elif name in launcher.drop_valued:
            changes.append(f"dropped {name}")
            i += 1 if has_inline else 2
        elif name in launcher.drop_flags:
            changes.append(f"dropped {name}")
            i += 1
        else:
            out.append(token)
            i += 1
    if not seen_count:
        if launcher.insert:
            out = [launcher.count[0], "1", *out]
            changes.append(f"{launcher.count[0]} 1 (added)")
        elif launcher.no_count:
            return SingleRank(None, launcher=launcher.name, why=launcher.no_count)
    if world is None and launcher.no_count:
        world = None  # told by the control run's records instead
    for flag in launcher.add:
        if flag not in out and flag.replace("-", "_") not in out:
            out = [flag, *out]
            changes.append(f"{flag} (added)")
    if world == 1:
        return SingleRank(None, 1, launcher.name, why="the command already starts one process")
    return SingleRank([*head, *out, *program], world, launcher.name, changes=changes)


def with_lab_out(command: list[str], out: str) -> list[str]:
    """A `syncdoctor lab run` command with its --out set to `out` (the variant's run
    folder, so that the lab's own records land where the experiment reads them);
    other commands are returned unchanged."""
    found = _find(command)
    if found is None or found[0] is not LAB:
        return list(command)
    head, own = command[: found[1]], command[found[1] :]
    kept: list[str] = []
    i = 0
    while i < len(own):
        if own[i] == "--out":
            i += 2
        elif own[i].startswith("--out="):
            i += 1
        else:
            kept.append(own[i])
            i += 1
    return [*head, *kept, "--out", out]
