"""The `poot` entry point of poot-backend-vulkan: registers the vulkan backend."""
from __future__ import annotations

from poot.plugin import hookimpl

from poot_vulkan.backend import BACKEND_INSTANCE


@hookimpl
def poot_backends():
    return [BACKEND_INSTANCE]
