"""Process environment wgpu-native reads when it starts; set before `import wgpu`.

wgpu falls back to an OpenGL adapter silently when Vulkan is missing, and OpenGL
compute is not what we test or declare, so the backend type is pinned (Vulkan by
default) and the adapter we get is checked against it (`poot_wgpu.device`).
"""
from __future__ import annotations

import os
import stat
import tempfile

BACKEND_VAR = "WGPU_BACKEND_TYPE"
DEFAULT_BACKEND = "Vulkan"
#: backends with real compute shaders; OpenGL (GLES compute through ANGLE/EGL) is refused
ACCEPTED_BACKENDS = ("Vulkan", "Metal", "D3D12")


def configure() -> str:
    """Pin the wgpu backend type and give the Vulkan loader a private runtime dir.

    Returns the backend type the adapter must report.
    """
    os.environ.setdefault(BACKEND_VAR, DEFAULT_BACKEND)
    _private_runtime_dir()
    return os.environ[BACKEND_VAR]


def quiet_pinned_backend_notice() -> None:
    """wgpu logs "Forcing backend: ..." as a warning whenever the variable pins the
    backend; poot pins it on purpose, so that one line would only add noise to every
    `poot` command. Other wgpu warnings still show. Call after `import wgpu` (wgpu
    installs its own logger class and refuses a logger made before it)."""
    import logging

    class _DropPinNotice(logging.Filter):
        def filter(self, record: logging.LogRecord) -> bool:
            return not str(record.msg).startswith("Forcing backend:")

    log = logging.getLogger("wgpu")
    if not any(isinstance(f, _DropPinNotice) or type(f).__name__ == "_DropPinNotice"
               for f in log.filters):
        log.addFilter(_DropPinNotice())


def _private_runtime_dir() -> None:
    # The loader warns (on stderr, every process) when XDG_RUNTIME_DIR is unset or not 0700.
    current = os.environ.get("XDG_RUNTIME_DIR")
    if current and _is_private_dir(current):
        return
    path = os.path.join(tempfile.gettempdir(), f"poot-wgpu-xdg-{os.getuid()}")
    os.makedirs(path, mode=0o700, exist_ok=True)
    if not _is_private_dir(path):  # someone else's folder or wrong mode: make our own
        path = tempfile.mkdtemp(prefix="poot-wgpu-xdg-")
    os.environ["XDG_RUNTIME_DIR"] = path


def _is_private_dir(path: str) -> bool:
    try:
        st = os.stat(path)
    except OSError:
        return False
    return (stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid()
            and stat.S_IMODE(st.st_mode) == 0o700)
