"""The `poot` entry point of poot-backend-cuda."""
from __future__ import annotations

from poot.plugin import hookimpl

from poot_cuda.backend import CudaBackend

_backend = CudaBackend()


@hookimpl
def poot_backends():
    return [_backend]
