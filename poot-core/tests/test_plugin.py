"""The plugin seam: registration, broken plugins, slot roles, backend selection, `poot backends`."""
from __future__ import annotations

import contextlib

import pytest
from poot.backend import Backend, Device, get_backend, select_backend
from poot.capability import CapabilityTable, Use
from poot.dtypes import DType
from poot.errors import DeviceUnavailable, PootError, UnknownBackend
from poot.ir.types import SlotKind
from poot.plugin import PluginManager, hookimpl, manager, register, unregister


class FakeBackend(Backend):
    def __init__(self, name, priority, devices=1, reason=None):
        self.name, self.priority, self._n, self._reason = name, priority, devices, reason

    def probe(self):
        return [Device(self.name, i, f"fake {i}") for i in range(self._n)]

    def unavailable_reason(self):
        return None if self._n else self._reason

    def capabilities(self, device):
        return CapabilityTable.declare(self.name, device.id, {DType.F32: Use.all()},
                                       {"Binary.Add": [DType.F32]})


class Plugin:
    def __init__(self, backends=(), roles=(), fail=None):
        self._backends, self._roles, self._fail = list(backends), list(roles), fail

    @hookimpl
    def poot_backends(self):
        if self._fail:
            raise RuntimeError(self._fail)
        return self._backends

    @hookimpl
    def poot_slot_roles(self):
        return self._roles


@contextlib.contextmanager
def plugged(*plugins):
    for i, p in enumerate(plugins):
        register(p, name=f"test-plugin-{id(p)}-{i}")
    try:
        yield manager()
    finally:
        for p in plugins:
            unregister(p)
        for key in [k for k in manager().broken if k.startswith("test-plugin-")]:
            del manager().broken[key]


def test_reference_backend_is_always_there():
    b = get_backend("reference")
    (dev,) = b.probe()
    t = b.capabilities(dev)
    assert all(t.uses(d) == Use.all() for d in DType)
    assert "dense:f16words" in t.lowers("PackedContraction")


def test_registered_backend_appears_and_goes():
    with plugged(Plugin([FakeBackend("fake-a", 1)])) as m:
        assert "fake-a" in m.backends()
    assert "fake-a" not in manager().backends()


def test_two_backends_with_one_name_is_an_error():
    with plugged(Plugin([FakeBackend("twin", 1)]), Plugin([FakeBackend("twin", 2)])) as m:
        with pytest.raises(PootError, match="two plugins register a backend named 'twin'"):
            m.backends()


def test_a_raising_hook_is_recorded_and_hides_no_other_backend():
    with plugged(Plugin(fail="driver exploded"), Plugin([FakeBackend("fine", 1)])) as m:
        assert "fine" in m.backends() and "reference" in m.backends()
        assert any("driver exploded" in v for v in m.broken.values())


def test_broken_entry_point_is_recorded(monkeypatch):
    class EP:
        name = "exploding"

        def load(self):
            raise ImportError("No module named 'poot_exploding'")

    import importlib_metadata

    monkeypatch.setattr(importlib_metadata, "entry_points", lambda group: [EP()])
    m = PluginManager()
    assert m.broken == {"exploding": "ImportError: No module named 'poot_exploding'"}
    assert "reference" in m.backends()


def test_slot_roles_are_declared_through_the_hook():
    role = SlotKind.declare("test.adapter", DType.I32, 0, 8, owner="test-plugin")
    with plugged(Plugin(roles=[role])) as m:
        assert m.slot_roles()["test.adapter"] is SlotKind.get("test.adapter")
        assert SlotKind.get("test.adapter").hi == 8


def test_a_conflicting_slot_role_marks_its_plugin_broken():
    SlotKind.declare("test.expert", DType.I32, 0, 4, owner="first")
    clash = SlotKind("test.expert", DType.I32, 0, 16, owner="second")
    with plugged(Plugin(roles=[clash])) as m:
        assert "test.expert" not in m.slot_roles()
        assert any("already declared" in v for v in m.broken.values())
    assert SlotKind.get("test.expert").hi == 4


def test_select_prefers_a_real_device_over_the_reference():
    gpu = FakeBackend("fake-gpu", 50)
    ghost = FakeBackend("fake-ghost", 99, devices=0, reason="no driver")
    with plugged(Plugin([gpu, ghost])):
        backend, device = select_backend()
        assert backend is gpu and device.id == "fake-gpu:0"
        assert select_backend("reference")[0].name == "reference"
        with pytest.raises(DeviceUnavailable, match="no driver"):
            select_backend("fake-ghost")


def test_select_falls_back_to_the_reference(monkeypatch):
    import poot.plugin

    bare = PluginManager(load_entry_points=False)  # only the reference, no installed GPU
    bare.register(Plugin([FakeBackend("fake-low", -5), FakeBackend("fake-off", 9, 0, "off")]))
    monkeypatch.setattr(poot.plugin, "_manager", bare)
    backend, device = select_backend()
    assert backend.name == "reference" and device.id == "reference:0"


def test_unknown_backend_lists_the_installed_ones():
    with pytest.raises(UnknownBackend) as ei:
        select_backend("no-such-backend")
    assert "no-such-backend" in str(ei.value) and "reference" in str(ei.value)


def test_poot_backends_prints_devices_reasons_tables_and_broken(capsys):
    from poot.cli import main

    with plugged(Plugin([FakeBackend("fake-gpu", 50), FakeBackend("fake-none", 3, 0,
                                                                    "no fake driver")]),
                 Plugin(fail="cannot load")):
        assert main(["backends"]) == 0
    out = capsys.readouterr().out
    assert "fake-gpu (priority 50" in out and "device fake-gpu:0 (fake 0)" in out
    assert "dtypes: f32:storage+convert+arith+dot" in out and "Binary 1/13" in out
    assert "fake-none (priority 3" in out and "no device: no fake driver" in out
    assert "reference (priority 0, numpy, plugin poot.reference-backend)" in out
    assert "plugins that failed to load:" in out and "cannot load" in out
    assert out.index("fake-gpu") < out.index("fake-none") < out.index("reference")


def test_poot_backends_full_table(capsys):
    from poot.cli import main

    assert main(["backends", "--table"]) == 0
    assert "| Binary.Add |" in capsys.readouterr().out
