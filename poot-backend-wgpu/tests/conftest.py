"""One wgpu device for the whole test session (opening one costs about a second)."""
from __future__ import annotations

import copy

import pytest
from poot_wgpu import probe


@pytest.fixture(scope="session")
def wgpu_device():
    found = probe()
    if not found.available:
        pytest.skip(f"wgpu backend: {found.reason}")
    from poot_wgpu.device import open_device

    return open_device()


@pytest.fixture
def limited(wgpu_device):
    """A view of the session device with some limits lowered (to test refusals cheaply)."""

    def make(**limits):
        dev = copy.copy(wgpu_device)
        dev.limits = dict(wgpu_device.limits)
        for key, value in limits.items():
            dev.limits[key.replace("_", "-")] = value
        return dev

    return make
