"""The `poot` entry point of poot-backend-wgpu: registers the wgpu backend."""
from __future__ import annotations

from poot.plugin import hookimpl

from poot_wgpu.backend import BACKEND_INSTANCE


@hookimpl
def poot_backends():
    return [BACKEND_INSTANCE]
