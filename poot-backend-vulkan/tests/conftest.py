"""One Vulkan device for the whole test session. The validation layer is switched on in
its own process (test_vulkan_validation.py): the process's instance is made once."""
from __future__ import annotations

import pytest


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
    from poot.plugin import get_backend

    backend = get_backend("vulkan")
    return backend, backend.probe()[0]
