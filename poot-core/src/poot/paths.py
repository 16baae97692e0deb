"""Where poot keeps files between runs: one cache root for models and compiled kernels."""
from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """$POOT_CACHE, else $XDG_CACHE_HOME/poot, else ~/.cache/poot (not created here)."""
    configured = os.environ.get("POOT_CACHE")
    if configured:
        return Path(configured).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "poot"
