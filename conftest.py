"""Fixtures shared by every package's tests (pytest loads this root conftest for all)."""
from __future__ import annotations

import pytest


def _real_model(name: str, variable: str):
    """Path of a known model's real file, or a skip that says how to get it."""
    from poot.models import hub

    path = {"smollm2": hub.smollm2_path, "gemma3-270m": hub.gemma3_path}[name]()
    if path is None:
        pytest.skip(f"{name} GGUF not found at {hub.cached_model_path(name)}: run "
                    f"`poot pull {name}` or set {variable}")
    return path


@pytest.fixture(scope="session")
def smollm2_gguf():
    """Path of the real SmolLM2-135M-Instruct.Q4_1.gguf."""
    return _real_model("smollm2", "POOT_SMOLLM2_GGUF")


@pytest.fixture(scope="session")
def gemma3_gguf():
    """Path of the real Gemma 3 270M GGUF (Q4_K_M)."""
    return _real_model("gemma3-270m", "POOT_GEMMA3_GGUF")


def pytest_collection_modifyitems(config, items):
    """In a pytest-xdist worker (scripts/test.sh: `-n N --dist loadfile`), files with
    whole-model (slow) tests come first: the controller hands out whole files in this order,
    so the last ones handed out are short and the workers finish together. The order within
    a file, and of the other files, is kept."""
    if not hasattr(config, "workerinput"):
        return
    slow = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.path not in slow)
