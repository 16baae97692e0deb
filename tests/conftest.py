"""Cross-package tests: helpers such as reference_llama import by module name."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

# Tests here import helpers such as reference_llama by module name; keep that working under
# pytest's importlib import mode too, which does not put this folder on sys.path.
if str(Path(__file__).parent) not in sys.path:
    sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture
def wgpu_device():
    """Skip with the probe's reason where no wgpu adapter is found."""
    from poot.errors import PootError
    from poot.plugin import select_backend

    try:
        select_backend("wgpu")
    except PootError as exc:
        pytest.skip(f"no wgpu device: {exc}")
