"""The `poot` entry point of poot-backend-rocm."""
from __future__ import annotations

from poot.plugin import hookimpl

from poot_rocm.backend import RocmBackend

_backend = RocmBackend()


@hookimpl
def poot_backends():
    return [_backend]
