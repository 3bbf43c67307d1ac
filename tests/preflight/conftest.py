from __future__ import annotations

from pathlib import Path

import pytest

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "preflight"


@pytest.fixture
def fixtures() -> Path:
    return FIXTURES
