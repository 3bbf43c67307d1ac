"""Code-consistency manifests: the sha256 of every source file of the code tree and
the version of every installed package, written on each node and compared.
Snapshot records carry the same information per rank (code.files, versions)."""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import platform
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MANIFEST_SCHEMA = "syncdoctor.manifest/1"
# Source and configuration files only: checkpoints and data sets would take minutes
# to hash and say nothing about the code a rank runs.
SOURCE_SUFFIXES = frozenset(
    {
        ".py",
        ".pyx",
        ".pxd",
        ".pyi",
        ".sh",
        ".json",
        ".yaml",
        ".yml",
        ".toml",
        ".cfg",
        ".ini",
        ".txt",
        ".c",
        ".cc",
        ".cpp",
        ".h",
        ".hpp",
        ".cu",
        ".cuh",
    }
)
MAX_FILE_BYTES = 8 << 20

# Folders never walked, by the manifest nor by preflight: tool caches, environments, VCS.
SKIP_DIRS = frozenset(
    {
        ".git",
        ".hg",
        ".svn",
        "__pycache__",
        ".venv",
        "venv",
        "env",
        "site-packages",
        "node_modules",
        ".tox",
        ".nox",
        ".mypy_cache",
        ".pytest_cache",
        ".ruff_cache",
        "build",
        "dist",
        ".eggs",
    }
)


class ManifestError(ValueError):
    pass


@dataclass
class Manifest:
    path: str  # where it was read from (a manifest file or a record file)
    label: str  # how a node is named in messages
    files: dict[str, str] = field(default_factory=dict)
    packages: dict[str, str] = field(default_factory=dict)
    python: str | None = None
    platform: str | None = None


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def hash_tree(roots: Sequence[str | Path]) -> dict[str, str]:
    """{relative path: sha256} of the source files under `roots` (files or folders)."""
    out: dict[str, str] = {}
    for raw in roots:
        root = Path(raw)
        if root.is_file():
            out[root.name] = sha256_file(root)
            continue
        for dirpath, dirs, files in os.walk(root):
            dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS and not d.startswith("."))
            for name in sorted(files):
                path = Path(dirpath) / name
                if path.suffix.lower() not in SOURCE_SUFFIXES:
                    continue
                try:
                    if path.stat().st_size > MAX_FILE_BYTES:
                        continue
                    out[path.relative_to(root).as_posix()] = sha256_file(path)
                except OSError:
                    continue
    return out


def installed_packages() -> dict[str, str]:
    packages: dict[str, str] = {}
    for dist in importlib.metadata.distributions():
        name = dist.metadata["Name"]
        if name:
            packages[_norm(name)] = dist.version
    return dict(sorted(packages.items()))


def _norm(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def build_manifest(roots: Sequence[str | Path]) -> dict[str, Any]:
    return {
        "schema": MANIFEST_SCHEMA,
        "host": platform.node(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "executable": sys.executable,
        "roots": [str(Path(r).resolve()) for r in roots],
        "files": hash_tree(roots),
        "packages": installed_packages(),
    }


def write_manifest(out: str | Path, roots: Sequence[str | Path]) -> dict[str, Any]:
    data = build_manifest(roots)
    Path(out).write_text(json.dumps(data, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    return data


def load_manifest(path: str | Path) -> Manifest:
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise ManifestError(f"{path}: cannot read manifest ({exc.strerror})") from None
    except json.JSONDecodeError as exc:
        raise ManifestError(f"{path}:{exc.lineno}:{exc.colno}: malformed manifest JSON: {exc.msg}") from None
    if not isinstance(data, dict) or not isinstance(data.get("files"), dict):
        raise ManifestError(f'{path}: not a syncdoctor manifest (no "files" object)')
    return Manifest(
        path=str(path),
        label=f"{Path(path).name} ({data['host']})" if data.get("host") else Path(path).name,
        files={str(k): str(v) for k, v in data["files"].items()},
        packages={_norm(str(k)): str(v) for k, v in (data.get("packages") or {}).items()},
        python=data.get("python"),
        platform=data.get("platform"),
    )


def manifests_from_records(snapshots: Iterable[Any]) -> list[Manifest]:
    """One manifest per rank from the `code` and `versions` of snapshot records; file
    paths are made relative to the folder of the entry script so that two nodes with
    the code in different folders still compare."""
    out: list[Manifest] = []
    for snap in snapshots:
        rec = snap.record
        code = rec.get("code") or {}
        files = code.get("files")
        if not isinstance(files, dict):
            continue
        base = os.path.dirname(str(code.get("entry") or ""))
        versions = {str(k): str(v) for k, v in (rec.get("versions") or {}).items() if v}
        out.append(
            Manifest(
                path=snap.path,
                label=f"rank {rec.get('rank', '?')}" + (f" ({rec['host']})" if rec.get("host") else ""),
                files={_relative(str(p), base): str(h) for p, h in files.items()},
                packages={_norm(k): v for k, v in versions.items() if k != "python"},
                python=versions.get("python"),
            )
        )
    return out


def _relative(path: str, base: str) -> str:
    if base and os.path.isabs(path) and path.startswith(base.rstrip("/") + "/"):
        return path[len(base.rstrip("/")) + 1 :]
    return path
