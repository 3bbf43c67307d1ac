"""No module of a package uses another module's private name (CI, beside the import contracts).

import-linter checks which modules import which (inside functions too); this checks what
they take: `from pkg.other import _name` or `other._name` on a module bound by an import,
where `other` is another module of the same package. A private name is an implementation
detail of its module; whoever needs it needs a public name, in the module that owns it.

    python scripts/check_private_names.py [SRC_DIR] [PACKAGE]    (default: src syncdoctor)

Prints one line per use (path:line: what) and exits 1 if there is any.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path


def _is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def module_name(path: Path, src: Path) -> str:
    parts = list(path.relative_to(src).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _resolve(node: ast.ImportFrom, here: str, is_package: bool) -> str:
    if not node.level:
        return node.module or ""
    base = here.split(".") if is_package else here.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, node.module] if node.module else base)


def _modules(src: Path, package: str) -> set[str]:
    return {module_name(p, src) for p in (src / package).rglob("*.py")}


def violations(src: Path, package: str) -> list[str]:
    modules = _modules(src, package)
    found = []
    for path in sorted((src / package).rglob("*.py")):
        here = module_name(path, src)
        tree = ast.parse(path.read_text(), filename=str(path))
        bound: dict[str, str] = {}  # local name -> the package module it is bound to
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name in modules and alias.asname:
                        bound[alias.asname] = alias.name
            elif isinstance(node, ast.ImportFrom):
                source = _resolve(node, here, path.name == "__init__.py")
                if source not in modules and source != package:
                    continue
                for alias in node.names:
                    full = f"{source}.{alias.name}"
                    if full in modules:
                        bound[alias.asname or alias.name] = full
                    elif _is_private(alias.name) and source != here:
                        found.append(f"{path}:{node.lineno}: {here} imports {source}.{alias.name}")
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id in bound
                and _is_private(node.attr)
                and bound[node.value.id] != here
            ):
                found.append(f"{path}:{node.lineno}: {here} uses {bound[node.value.id]}.{node.attr}")
    return sorted(set(found), key=found.index)


def main(argv: list[str]) -> int:
    src = Path(argv[1]) if len(argv) > 1 else Path("src")
    package = argv[2] if len(argv) > 2 else "syncdoctor"
    found = violations(src, package)
    for line in found:
        print(line)
    if found:
        print(f"{len(found)} uses of another module's private name (give it a public name where it lives)")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
