"""The probe's reason for skipping device runs; compiled kernels land in a test cache."""
from __future__ import annotations

import pytest
from poot_rocm.probe import probe


@pytest.fixture(scope="session")
def gpu():
    """The first ROCm device's info, or a skip naming why there is none."""
    devices, reason = probe()
    if not devices:
        pytest.skip(reason)
    return devices[0]
