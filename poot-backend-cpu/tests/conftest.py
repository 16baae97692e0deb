"""The cpu device for the whole session, or a skip naming why there is none."""
from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def cpu_backend():
    from poot_cpu import BACKEND

    reason = BACKEND.unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    return BACKEND
