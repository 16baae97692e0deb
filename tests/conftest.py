"""Cross-package fixtures: the real SmolLM2 GGUF, found the way poot's own tests find it."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

# Tests here import helpers such as reference_llama by module name; keep that working under
# pytest's importlib import mode too, which does not put this folder on sys.path.
if str(Path(__file__).parent) not in sys.path:
    sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture(scope="session")
def smollm2_gguf():
    """Path of SmolLM2-135M-Instruct.Q4_1.gguf, or a skip that says how to get it."""
    from poot.models.hub import cached_model_path, smollm2_path

    path = smollm2_path()
    if path is None:
        pytest.skip(f"SmolLM2 GGUF not found at {cached_model_path('smollm2')}: run "
                    "`poot pull smollm2` (or python -c \"from poot.models.hub import pull; "
                    "pull('smollm2')\") or set POOT_SMOLLM2_GGUF")
    return path
