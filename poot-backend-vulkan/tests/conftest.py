"""One Vulkan device for the whole test session; validation layers on where installed."""
from __future__ import annotations

import os

import pytest

os.environ.setdefault("POOT_VULKAN_VALIDATION", "1")  # used only when the layer exists


@pytest.fixture(scope="session")
def vulkan_device():
    from poot_vulkan import probe

    found = probe()
    if not found.available:
        pytest.skip(f"vulkan backend: {found.reason}")
    from poot_vulkan.device import open_device

    return open_device(0)


@pytest.fixture(scope="session")
def vulkan_target(vulkan_device):
    from poot.backend import get_backend

    backend = get_backend("vulkan")
    return backend, backend.probe()[0]
