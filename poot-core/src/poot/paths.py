"""Where poot keeps files: one cache root for models and compiled kernels between runs, and
the private runtime folder the Vulkan loader wants."""
from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path


def cache_dir() -> Path:
    """$POOT_CACHE, else $XDG_CACHE_HOME/poot, else ~/.cache/poot (not created here)."""
    configured = os.environ.get("POOT_CACHE")
    if configured:
        return Path(configured).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "poot"


def private_runtime_dir(tag: str) -> None:
    """Point $XDG_RUNTIME_DIR at a folder only this user can enter (mode 0700), unless it
    already names one: the Vulkan loader warns on stderr, every process, when the variable
    is unset or the folder is not private. `tag` names the folder made in the temp dir."""
    current = os.environ.get("XDG_RUNTIME_DIR")
    if current and _is_private_dir(current):
        return
    path = os.path.join(tempfile.gettempdir(), f"poot-{tag}-xdg-{os.getuid()}")
    os.makedirs(path, mode=0o700, exist_ok=True)
    if not _is_private_dir(path):  # someone else's folder or wrong mode: make our own
        path = tempfile.mkdtemp(prefix=f"poot-{tag}-xdg-")
    os.environ["XDG_RUNTIME_DIR"] = path


def _is_private_dir(path: str) -> bool:
    try:
        st = os.stat(path)
    except OSError:
        return False
    return (stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid()
            and stat.S_IMODE(st.st_mode) == 0o700)
