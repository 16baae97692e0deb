"""Backend plugins of the `poot.backends` entry point group are imported on demand: naming
one backend imports its plugin alone; listing every backend imports them all; a plugin
that fails to load is still reported by name."""
from __future__ import annotations

import sys

import pytest
from poot.errors import UnknownBackend
from poot.plugin import BACKEND_GROUP, PluginManager

PLUGIN = '''
from poot.capability import CapabilityTable, Use
from poot.contract import Backend, Device
from poot.dtypes import DType
from poot.plugin import hookimpl


class Lazy(Backend):
    name, priority = {name!r}, 1

    def probe(self):
        return [Device(self.name, 0, "lazy")]

    def capabilities(self, device):
        return CapabilityTable.declare(self.name, device.id, {{DType.F32: Use.all()}},
                                       {{"Binary.Add": [DType.F32]}})


@hookimpl
def poot_backends():
    return [Lazy()]
'''


def backend_distribution(site, name: str, body: str | None = None) -> str:
    """An installed distribution whose BACKEND_GROUP entry point `name` is module
    poot_lazy_<name> (registering a backend `name`, or running `body`)."""
    module = f"poot_lazy_{name}"
    site.distribution(f"poot-backend-lazy-{name}", module,
                      body if body is not None else PLUGIN.format(name=name),
                      group=BACKEND_GROUP, entry=name)
    return module


def test_naming_a_backend_imports_its_plugin_alone(site):
    first = backend_distribution(site, "lazyone")
    second = backend_distribution(site, "lazytwo")
    m = PluginManager()
    assert first not in sys.modules and second not in sys.modules
    assert m.distributions["lazyone"] == "poot-backend-lazy-lazyone 0.1.0"
    assert m.backend("lazyone").name == "lazyone"
    assert first in sys.modules and second not in sys.modules
    assert m.backend_plugins["lazyone"] == "lazyone"
    assert {"lazyone", "lazytwo", "reference"} <= set(m.backends())
    assert second in sys.modules


def test_a_lazy_plugin_that_fails_is_named_when_asked_for(site, monkeypatch):
    import poot.plugin

    backend_distribution(site, "lazybad", body="raise ImportError('no driver bindings')\n")
    monkeypatch.setattr(poot.plugin, "_manager", PluginManager())
    assert "lazybad" not in poot.plugin.manager().broken
    with pytest.raises(UnknownBackend, match=r"'lazybad' is not available: its plugin failed "
                                             r"to load .*no driver bindings"):
        poot.plugin.get_backend("lazybad")
