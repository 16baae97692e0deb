"""The probe's reason for skipping GPU runs."""
from __future__ import annotations

import pytest
from poot_cuda.probe import probe


@pytest.fixture(scope="session")
def gpu():
    """The first CUDA device's info, or a skip naming why there is none."""
    devices, reason = probe()
    if not devices:
        pytest.skip(reason)
    return devices[0]
