"""Fixtures shared by every package's tests (pytest loads this root conftest for all)."""
from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def smollm2_gguf():
    """Path of the real SmolLM2-135M-Instruct.Q4_1.gguf, or a skip that says how to get it."""
    from poot.models.hub import cached_model_path, smollm2_path

    path = smollm2_path()
    if path is None:
        pytest.skip(f"SmolLM2 GGUF not found at {cached_model_path('smollm2')}: run "
                    "`poot pull smollm2` or set POOT_SMOLLM2_GGUF")
    return path


@pytest.fixture(scope="session")
def gemma3_gguf():
    """Path of the real Gemma 3 270M GGUF (Q4_K_M), or a skip that says how to get it."""
    from poot.models.hub import cached_model_path, gemma3_path

    path = gemma3_path()
    if path is None:
        pytest.skip(f"Gemma 3 GGUF not found at {cached_model_path('gemma3-270m')}: run "
                    "`poot pull gemma3-270m` or set POOT_GEMMA3_GGUF")
    return path
