"""The command line as people expect it (argparse, ruff/pytest-style): every command
and option explained, true defaults, one-line errors for bad values, "did you mean",
a fault list readable at 80 columns, preflight that checks what it was given."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import pytest

from syncdoctor.cli import build_parser, main
from syncdoctor.lab.faults import FAULTS
from syncdoctor.lab.runner import LAB_CHECK_EVERY
from syncdoctor.probe.torch.probe import DEFAULT_CHECK_EVERY

REPO = Path(__file__).resolve().parents[3]
RANK_TABLES = REPO / "tests" / "rules" / "_shared" / "rank_tables"
BAD_SCRIPT = REPO / "tests" / "rules" / "PF314" / "fire.py"


def _parsers(parser: argparse.ArgumentParser, path: str = "syncdoctor"):
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _parsers(sub, f"{path} {name}")


def _help(*args: str) -> str:
    """`syncdoctor ARGS --help` as an 80-column terminal would show it."""
    import contextlib
    import io

    os.environ["COLUMNS"] = "80"  # argparse and the catalog read the width from here
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as exc:
            main([*args, "--help"])
    finally:
        del os.environ["COLUMNS"]
    assert exc.value.code == 0
    return out.getvalue()


def test_a_command_parsed_alone_is_parsed_as_in_the_whole_parser():
    """`main` builds only the parser of the command it was given (`syncdoctor run`
    starts before every job it watches): that parser takes the same options, with the
    same help, as the whole one, and `COMMANDS` names every command the help lists."""
    from syncdoctor.cli.app import COMMANDS

    whole = dict(_parsers(build_parser()))
    assert sorted(p.removeprefix("syncdoctor ") for p in whole if p.count(" ") == 1) == sorted(COMMANDS)
    for name in COMMANDS:
        alone = dict(_parsers(build_parser(name)))
        assert sorted(alone) == sorted(p for p in whole if p == "syncdoctor" or p.startswith(f"syncdoctor {name}"))
        for path, parser in alone.items():
            if path != "syncdoctor":
                assert parser.format_help() == whole[path].format_help(), path


def test_every_command_and_option_has_help_text():
    parser = build_parser()
    missing = []
    for path, p in _parsers(parser):
        for action in p._actions:
            if isinstance(action, argparse._HelpAction | argparse._VersionAction):
                continue
            if isinstance(action, argparse._SubParsersAction):
                missing += [f"{path} {c.dest}" for c in action._choices_actions if not c.help]
                continue
            if not action.help:
                missing.append(f"{path} {'/'.join(action.option_strings) or action.dest}")
        if path != "syncdoctor" and not p.description:
            missing.append(f"{path} (no description)")
    assert missing == []


def test_help_states_the_true_check_every_defaults():
    run_help = " ".join(_help("run").split())
    assert f"default: {DEFAULT_CHECK_EVERY}, torch and MindSpore alike" in run_help
    assert "default 10;" not in run_help
    lab_help = " ".join(_help("lab", "run").split())
    assert f"--check-every K the probe's cross-rank check every K steps (default: {LAB_CHECK_EVERY})" in lab_help
    assert "--seed SEED the run's seed (every rank alike) (default: 0)" in lab_help
    assert "--world-size N ranks (processes) (default: 2)" in lab_help


@pytest.mark.parametrize(
    "args, message",
    [
        (["--world-size", "0"], "argument --world-size: must be at least 1, got 0"),
        (["--world-size", "-3"], "argument --world-size: must be at least 1, got -3"),
        (["--steps", "0"], "argument --steps: must be at least 1, got 0"),
        (["--check-every", "0"], "argument --check-every: must be at least 1, got 0"),
        (["--steps", "ten"], "argument --steps: 'ten' is not an integer"),
    ],
)
def test_lab_run_refuses_bad_numbers_in_one_line(tmp_path, capsys, args, message):
    out = tmp_path / "run"
    with pytest.raises(SystemExit) as exc:
        main(["lab", "run", "clean", "--out", str(out), *args])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines()[-1] == f"syncdoctor lab run: error: {message}"
    assert not out.exists()  # nothing ran, no empty run folder


def test_demo_refuses_zero_ranks(capsys):
    with pytest.raises(SystemExit):
        main(["demo", "--world-size", "0"])
    assert "argument --world-size: must be at least 1, got 0" in capsys.readouterr().err


@pytest.mark.parametrize(
    "args, message",
    [
        (["lab", "run", "dropped-rnk"], "unknown fault 'dropped-rnk' (did you mean 'dropped-rank'?)"),
        (["lab", "run", "clen"], "unknown fault 'clen' (did you mean 'clean'?)"),
        (["lab", "matrix", "--only", "grad-summ"], "unknown fault 'grad-summ' (did you mean 'grad-sum'?)"),
        (
            ["lab", "run", "grad-accum-misaligned", "--variant", "nosync"],
            "fault 'grad-accum-misaligned' has no variant 'nosync' (did you mean 'no_sync'?)",
        ),
    ],
)
def test_unknown_names_get_did_you_mean(capsys, args, message):
    assert main(args) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1
    assert message in err


def test_unrelated_fault_name_gets_no_guess(capsys):
    assert main(["lab", "run", "xyzzy"]) == 2
    assert "did you mean" not in capsys.readouterr().err


def test_lab_list_is_readable_at_80_columns_with_variants(monkeypatch, capsys):
    monkeypatch.setenv("COLUMNS", "80")
    assert main(["lab", "list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert max(len(line) for line in lines) <= 80
    starts = {line.split()[0] for line in lines if line and not line.startswith(" ")}
    assert set(FAULTS) <= starts  # every name whole, at the start of its own line
    for fault in FAULTS.values():
        variants = [v for v in fault.variants if v]
        if variants:
            assert f"    variants: {', '.join(variants)}" in lines


def test_preflight_with_only_a_rank_table_checks_only_that_table(tmp_path, capsys, monkeypatch):
    # The current folder holds a script with an error-level problem: it must not be read.
    (tmp_path / "train.py").write_text(BAD_SCRIPT.read_text())
    monkeypatch.chdir(tmp_path)
    code = main(["preflight", "--rank-table", str(RANK_TABLES / "good_v1.json"), "--no-environ"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "train.py" not in out
    assert out.strip() == "no problems found (1 rank table checked)"
    # With the folder named, it is checked too.
    assert main(["preflight", ".", "--rank-table", str(RANK_TABLES / "good_v1.json"), "--no-environ"]) == 1
    assert "PF314" in capsys.readouterr().out


def test_preflight_says_no_problems_found_and_what_it_checked(tmp_path, capsys):
    good = REPO / "tests" / "rules" / "PF316" / "silent.py"
    assert main(["preflight", str(good)]) == 0
    assert capsys.readouterr().out.strip() == "no problems found (1 script checked)"
    (tmp_path / "notes.txt").write_text("nothing to check here\n")
    assert main(["preflight", str(tmp_path)]) == 0
    assert capsys.readouterr().out.startswith(f"nothing to check in {tmp_path}")
    assert main(["preflight", str(good), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == []  # JSON stays JSON


def test_check_and_rule_titles_are_whole_sentences(capsys):
    assert main(["rules", "--json"]) == 0
    docs = json.loads(capsys.readouterr().out)
    titles = {d["code"]: d["title"] for d in docs if d["kind"] == "preflight"}
    assert titles["PF203"] == (
        "WORLD_SIZE / RANK_SIZE disagree between processes, with each other, or with the ranks present."
    )
    for code in ("PF204", "PF313", "PF315", "PF316"):
        assert titles[code].endswith("."), (code, titles[code])
    assert all(t.endswith((".", ")", ":")) for t in titles.values()), titles
