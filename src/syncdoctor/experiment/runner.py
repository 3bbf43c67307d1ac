"""One experiment: the user's job rerun for N steps as it is (the control), then once
per variant, each in its own run folder, and the comparison that says which variant
makes the anomaly disappear (docs/experiment.md). `syncdoctor experiment` is its
command line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from syncdoctor.experiment import inrank
from syncdoctor.settings import VARIANT_LR_ENV, VARIANT_WORLD_ENV

SCHEMA = "syncdoctor.experiment/1"
DEFAULT_STEPS = 200
DEFAULT_CHECK_EVERY = 10  # reruns are short: a check every 10 steps gives the doctor enough
DEFAULT_TIMEOUT_S = 900.0


def run_experiment(
    command: list[str],
    out: Path,
    *,
    variants: list[str],
    steps: int | None,
    check_every: int | None = DEFAULT_CHECK_EVERY,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    progress: Any = None,
) -> dict[str, Any]:
    """Run the control and each variant; returns the JSON result (also OUT/experiment.json)."""
    from syncdoctor.experiment.compare import Measures, compare, measure
    from syncdoctor.experiment.launch import run_variant
    from syncdoctor.experiment.single import single_rank, with_lab_out

    say = progress or (lambda _text: None)
    out = out.resolve()
    out.mkdir(parents=True, exist_ok=True)

    def one(name: str, cmd: list[str], env: dict[str, str]) -> Measures:
        folder = out / name
        say(f"{name}: {' '.join(cmd)}")
        result = run_variant(
            with_lab_out(cmd, str(folder)),
            folder,
            env_extra=env,
            steps=steps,
            check_every=check_every,
            timeout_s=timeout_s,
        )
        m = measure(name, folder)
        m.returncode, m.timed_out = result.returncode, result.timed_out
        if result.returncode in (126, 127) and m.steps is None:
            m.error = f"the command could not start (exit {result.returncode}; see {folder}/.syncdoctor/launcher.log)"
        if result.timed_out and not m.error:
            m.error = f"timed out after {timeout_s:g} s" if m.steps is None else ""
        say(f"{name}: done in {result.seconds:.0f} s, exit {result.returncode}, {m.steps or 0} steps recorded")
        return m

    control = one("control", command, {})
    runs: list[Measures] = []
    single = single_rank(command)
    world = control.world_size or single.world_size
    for name in variants:
        env = inrank.environment(name)
        if world:
            env[VARIANT_WORLD_ENV] = str(world)
        if name == "single":
            if control.first_lr:
                env[VARIANT_LR_ENV] = repr(control.first_lr)
            if single.command is None:
                m = Measures(name, str(out / name), ran=False, how=single.why)
                runs.append(m)
                say(f"single: not applied: {single.why}")
                continue
            m = one(name, single.command, env)
            if m.applied is None:
                m.how = "; ".join(single.changes)
            runs.append(m)
        else:
            runs.append(one(name, command, env))
    comparison = compare(control, runs)
    result = {
        "schema": SCHEMA,
        "command": command,
        "steps": steps,
        "out": str(out),
        "single_rank_command": single.command,
        **comparison.to_json(),
    }
    (out / "experiment.json").write_text(json.dumps(result, indent=1))
    result["_comparison"] = comparison
    return result
