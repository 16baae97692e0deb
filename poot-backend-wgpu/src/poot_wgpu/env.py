"""Process environment wgpu-native reads when it starts; set before `import wgpu`.

wgpu falls back to an OpenGL adapter silently when Vulkan is missing, and OpenGL
compute is not what we test or declare, so the backend type is pinned (Vulkan by
default) and the adapter we get is checked against it (`poot_wgpu.device`).
"""
from __future__ import annotations

import os

from poot.paths import private_runtime_dir

BACKEND_VAR = "WGPU_BACKEND_TYPE"
DEFAULT_BACKEND = "Vulkan"
#: backends with real compute shaders; OpenGL (GLES compute through ANGLE/EGL) is refused
ACCEPTED_BACKENDS = ("Vulkan", "Metal", "D3D12")
#: "off" compiles as before issue 56's level cuts (wide workgroups, attention over the
#: fresh keys): the A/B switch of the device benches, read as poot_vulkan reads it
LEVEL_CUTS_VAR = "POOT_LEVEL_CUTS"


def level_cuts() -> bool:
    """Whether the level cuts are on (POOT_LEVEL_CUTS is not "off")."""
    return os.environ.get(LEVEL_CUTS_VAR, "") != "off"


def configure() -> str:
    """Pin the wgpu backend type and give the Vulkan loader a private runtime dir.

    Returns the backend type the adapter must report.
    """
    os.environ.setdefault(BACKEND_VAR, DEFAULT_BACKEND)
    private_runtime_dir("wgpu")
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
