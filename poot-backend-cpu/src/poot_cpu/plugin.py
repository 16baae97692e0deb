"""The `poot` entry point of poot-backend-cpu."""
from __future__ import annotations

from poot.plugin import hookimpl

from poot_cpu.backend import BACKEND


@hookimpl
def poot_backends():
    return [BACKEND]
