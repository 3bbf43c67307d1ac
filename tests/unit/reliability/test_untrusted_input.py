"""Nothing from the input is ever executed or deserialised into objects, and an
unknown record schema version is refused with one clear line.

The source scan walks the syntax tree of every module under src/ (a text grep would
trip on docstrings such as "pickled objects" and on model.eval()). Anything new that
matches must either go or be added to ALLOWED with the reason it is safe."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from syncdoctor.cli import main
from syncdoctor.records import RecordError, read_run

SRC = Path(__file__).resolve().parents[3] / "src" / "syncdoctor"

# Modules whose only use is turning bytes into live objects or running code.
UNSAFE_MODULES = {"pickle", "cPickle", "_pickle", "marshal", "shelve", "dill", "cloudpickle", "joblib", "runpy", "code"}
UNSAFE_BUILTINS = {"eval", "exec", "compile", "__import__", "input"}
# (module alias as written, attribute): loaders that unpickle or run code.
UNSAFE_CALLS = {
    ("torch", "load"),
    ("yaml", "load"),
    ("yaml", "unsafe_load"),
    ("yaml", "full_load"),
    ("np", "load"),
    ("numpy", "load"),
    ("os", "system"),
    ("os", "popen"),
    ("importlib", "import_module"),
    ("ms", "load_checkpoint"),
    ("mindspore", "load_checkpoint"),
    ("pd", "read_pickle"),
}
ALLOWED = {
    (
        "probe/run/boot.py",
        "importlib.import_module",
    ): "imports the in-rank plugins named in SYNCDOCTOR_PLUGINS, only modules of syncdoctor itself",
    (
        "rulebook.py",
        "importlib.import_module",
    ): "imports the modules of the rules' or checks' own package, listed by pkgutil, never a name from input",
    (
        "records/__init__.py",
        "importlib.import_module",
    ): "lazy import of syncdoctor.records.<reader|schema|writer> from a fixed table",
    (
        "probe/mindspore/attach.py",
        "importlib.import_module",
    ): "imports MindSpore's own modules named in the probe's source (the classes it patches), never a name from input",
    (
        "lab/forkserver.py",
        "runpy",
    ): "runs the rank module its runner names over the server's stdin, a pipe only that parent process holds",
}


def _findings(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names if a.name.split(".")[0] in UNSAFE_MODULES]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in UNSAFE_MODULES:
            found.append(node.module or "")
        elif isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Name) and func.id in UNSAFE_BUILTINS:
                found.append(func.id)
            elif (
                isinstance(func, ast.Attribute)
                and isinstance(func.value, ast.Name)
                and (func.value.id, func.attr) in UNSAFE_CALLS
            ):
                found.append(f"{func.value.id}.{func.attr}")
            for kw in node.keywords:  # subprocess.*(..., shell=True) and the like
                if kw.arg == "shell" and not (isinstance(kw.value, ast.Constant) and kw.value.value is False):
                    found.append("shell=True")
    return found


def test_source_never_unpickles_or_executes_input():
    offending = []
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).as_posix()
        for what in _findings(path):
            if (rel, what) not in ALLOWED:
                offending.append(f"{rel}: {what}")
    assert not offending, "unsafe loading or execution in src/:\n" + "\n".join(offending)


def test_scanner_catches_what_it_looks_for(tmp_path):
    """The scan itself works: each pattern in a throw-away module is found."""
    bad = tmp_path / "bad.py"
    bad.write_text(
        "import pickle\nfrom marshal import loads\nimport torch, yaml, subprocess\n"
        "torch.load('x')\nyaml.load('x')\neval('1')\nexec('1')\n"
        "subprocess.run('ls', shell=True)\nmodel.eval()\n"
    )
    assert _findings(bad) == ["pickle", "marshal", "torch.load", "yaml.load", "eval", "exec", "shell=True"]


def _records(tmp_path: Path, lines: list[str]) -> Path:
    (tmp_path / "records").mkdir()
    (tmp_path / "records" / "rank0.jsonl").write_text("".join(line + "\n" for line in lines))
    return tmp_path


@pytest.mark.parametrize("later", [False, True], ids=["first-record", "later-record"])
def test_unknown_schema_version_is_refused_in_one_clear_line(tmp_path, capsys, later):
    """tests/e2e/lab/test_diagnose.py checks the exit code; this checks the message."""
    lines = ['{"v":1,"kind":"snapshot","world_size":1}'] if later else []
    run = _records(tmp_path, [*lines, '{"v":2,"kind":"step","rank":0,"step":1}'])
    with pytest.raises(RecordError) as info:
        read_run(run)
    line = 2 if later else 1
    assert str(info.value) == (
        f"{run / 'records' / 'rank0.jsonl'}:{line}: record schema version 2 "
        "is not supported (this syncdoctor reads version 1)"
    )
    assert main(["diagnose", str(run)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and err.startswith("syncdoctor: error: ")


def test_json_without_a_version_is_damage_not_a_new_version(tmp_path):
    run = _records(
        tmp_path,
        [
            '{"v":1,"kind":"snapshot","world_size":1}',
            "{}",
            "[1, 2]",
            '{"v":1,"kind":"step","rank":0,"step":1,"loss":0.5}',
        ],
    )
    records = read_run(run)
    assert records.steps.height == 1
    assert "rank0.jsonl: 2 unreadable lines skipped" in records.warnings
