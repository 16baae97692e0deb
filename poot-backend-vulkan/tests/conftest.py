"""One Vulkan device for the whole test session. The validation layer is switched on in
a process of its own (`run_validated`): the process's instance is made once."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

#: what run_validated wraps a script in: it ends at once where the layer is not installed,
#: and prints every validation message, then their count
_LAYER_CHECK = """from poot_vulkan.device import instance
if not instance().layers:
    print("NO-LAYER"); raise SystemExit(0)
"""
_LAYER_REPORT = """
for m in instance().validation_messages:
    print("VALIDATION:", m)
print("MESSAGES", len(instance().validation_messages))
"""


def _run_validated(script: str, **env: str) -> str:
    """`script` in a fresh process whose instance has the Khronos validation layer on (the
    layer must be on when the process's instance is made), with `env` added; skips where
    the layer is not installed, fails on any validation message; the script's output."""
    env = dict(os.environ, POOT_VULKAN_VALIDATION="1", **env)
    proc = subprocess.run([sys.executable, "-c", _LAYER_CHECK + script + _LAYER_REPORT],
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    if "NO-LAYER" in proc.stdout:
        pytest.skip("VK_LAYER_KHRONOS_validation is not installed")
    assert "MESSAGES 0" in proc.stdout, proc.stdout
    return proc.stdout


@pytest.fixture(scope="session")
def run_validated():
    """_run_validated, for the tests that run a script under the validation layer."""
    return _run_validated


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
