"""The command line is a package of its own (src/syncdoctor/cli/): every command has its
module there and none elsewhere, and command modules share only cli/options.py. (That
no library imports the command line is an import contract: pyproject.toml.)"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[3] / "src"
PACKAGE = SRC / "syncdoctor"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(source: str, module: str, is_package: bool = False) -> set[str]:
    """Every module ``module`` imports, anywhere in its source; `from X import y`
    counts as X and as X.y (y may be a module)."""
    found: set[str] = set()
    package = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            found.add(base)
            found |= {f"{base}.{alias.name}" for alias in node.names}
    return found


def is_cli(name: str) -> bool:
    return name == "syncdoctor.cli" or name.startswith("syncdoctor.cli.") or name.endswith(".cli")


def test_the_reader_sees_imports_inside_functions_and_relative_ones():
    source = "def f():\n    from syncdoctor.probe import cli\n    from ..cli import options\nimport json\n"
    found = imports_of(source, "syncdoctor.lab.runner")
    assert "syncdoctor.probe.cli" in found
    assert "syncdoctor.cli.options" in found
    assert not any(is_cli(n) for n in imports_of("import json\nfrom syncdoctor.lab import faults\n", "x.y"))


def test_every_command_has_its_module_in_the_cli_package():
    from syncdoctor.cli import build_parser

    parser = build_parser()
    commands = next(a for a in parser._actions if a.dest == "command").choices
    assert {(PACKAGE / "cli" / f"{name}.py").is_file() for name in commands} == {True}, sorted(commands)
    assert not (PACKAGE / "cli.py").exists()


def test_only_the_cli_package_defines_subcommands():
    """A `syncdoctor` subcommand is registered by a module of cli/ and nowhere else."""
    outside = set()
    for path in PACKAGE.rglob("*.py"):
        if "cli" in path.relative_to(PACKAGE).parts[:1]:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "add_parser":
                outside.add(module_name(path))
    assert outside == set()


def test_command_modules_import_only_the_shared_options():
    """No circle inside the CLI: app.py imports the command modules, they import the
    shared modules (options.py, allocator.py) and the library parts, and the shared
    modules import no CLI module."""
    shared = ("syncdoctor.cli.options", "syncdoctor.cli.allocator")
    for path in sorted((PACKAGE / "cli").glob("*.py")):
        name = module_name(path)
        if name in ("syncdoctor.cli", "syncdoctor.cli.app", "syncdoctor.cli.__main__"):
            continue
        cli = {n for n in imports_of(path.read_text(encoding="utf-8"), name) if n.startswith("syncdoctor.cli")}
        if name not in shared:  # the shared modules and nothing else of the CLI
            cli = {n for n in cli if not any(n == m or n.startswith(m + ".") for m in shared)}
        assert cli == set(), name
