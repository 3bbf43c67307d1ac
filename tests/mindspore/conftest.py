"""MindSpore tests: skipped with the reason when the extra is not installed here."""

from __future__ import annotations

import pytest

try:
    import mindspore  # noqa: F401

    MS_MISSING = None
except Exception as exc:  # no wheel for this platform, or numpy 2 in the way
    MS_MISSING = f"mindspore is not importable here ({exc!r}); install syncdoctor[mindspore]"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/mindspore" in str(item.fspath).replace("\\", "/"):
            item.add_marker(pytest.mark.mindspore)
            if MS_MISSING:
                item.add_marker(pytest.mark.skip(reason=MS_MISSING))
