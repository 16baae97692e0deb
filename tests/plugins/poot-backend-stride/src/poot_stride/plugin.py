"""The module the `poot` entry point names: poot calls its @hookimpl functions."""
from poot.contract import hookimpl

from poot_stride.backend import StrideBackend


@hookimpl
def poot_backends():
    return [StrideBackend()]
