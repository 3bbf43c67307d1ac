from __future__ import annotations

from pathlib import Path

import pytest

FIXTURES = Path(__file__).resolve().parents[2] / "rules" / "_shared"


@pytest.fixture
def fixtures() -> Path:
    return FIXTURES
