"""scripts/check_private_names.py, which CI runs over src/: it finds a module taking another
module's private name, by import and by attribute, and leaves alone what is allowed."""

from __future__ import annotations

from pathlib import Path

from tests.scripts import load_script


def _checker():  # noqa: ANN202 - a module loaded from a script path
    return load_script("check_private_names")


def _package(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / "pkg" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def test_a_private_name_taken_by_import_or_by_attribute_is_named(tmp_path: Path) -> None:
    src = _package(
        tmp_path,
        {
            "__init__.py": "",
            "owner.py": "_secret = 1\npublic = 2\ndef _helper():\n    return 3\n",
            "taker.py": "from pkg.owner import _secret\n",
            "deep/__init__.py": "",
            "deep/user.py": "def f():\n    from pkg import owner as o\n    return o._helper()\n",
            "relative.py": "from .owner import _helper\n",
        },
    )
    found = _checker().violations(src, "pkg")
    assert any("pkg.taker imports pkg.owner._secret" in line for line in found), found
    assert any("pkg.deep.user uses pkg.owner._helper" in line for line in found), found
    assert any("pkg.relative imports pkg.owner._helper" in line for line in found), found
    assert len(found) == 3, found


def test_public_names_dunders_and_a_modules_own_privates_pass(tmp_path: Path) -> None:
    src = _package(
        tmp_path,
        {
            "__init__.py": "from pkg.owner import public\n",
            "owner.py": "_secret = 1\npublic = 2\nprint(_secret)\n",
            "user.py": "import os\nfrom pkg import owner\nprint(owner.public, owner.__name__, os._exit)\n",
        },
    )
    assert _checker().violations(src, "pkg") == []
