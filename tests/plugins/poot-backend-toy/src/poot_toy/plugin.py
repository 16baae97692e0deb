"""The module the `poot` entry point names: poot calls its @hookimpl functions."""
from poot.plugin import hookimpl

from poot_toy.backend import ToyBackend


@hookimpl
def poot_backends():
    return [ToyBackend()]
