"""The plugin seam: registration, broken plugins, slot roles, backend selection, `poot backends`."""
from __future__ import annotations

import contextlib

import pytest
from poot.capability import CapabilityTable, Use
from poot.contract import Backend, Device
from poot.dtypes import DType
from poot.errors import DeviceUnavailable, UnknownBackend
from poot.ir.ops import BinaryOp
from poot.ir.types import SlotKind
from poot.plugin import PluginManager, hookimpl, manager, register, unregister
from poot.plugin import get_backend, select_backend


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


def test_two_plugins_registering_one_name_keep_the_first_and_hide_no_other():
    first, second = FakeBackend("twin", 1), FakeBackend("twin", 2)
    with plugged(Plugin([first]), Plugin([second, FakeBackend("other", 1)])) as m:
        table = m.backends()
        assert table["twin"] is first and "reference" in table and "other" in table
        # the second plugin is reported; its other backend still works
        (why,) = [v for k, v in m.broken.items() if k.startswith("test-plugin-")]
        assert "'twin'" in why and "already registers" in why


def test_a_hook_returning_one_backend_instead_of_a_list_is_reported(capsys):
    class Single:
        @hookimpl
        def poot_backends(self):
            return FakeBackend("lonely", 1)

    from poot.cli import main

    with plugged(Single(), Plugin([FakeBackend("fine", 1)])) as m:
        assert "fine" in m.backends() and "reference" in m.backends()
        assert any("not a list" in v for v in m.broken.values())
        assert main(["backends"]) == 0
    out = capsys.readouterr().out
    assert "plugins that failed to load:" in out and "not a list" in out


def test_a_hook_returning_a_list_of_something_else_is_reported():
    with plugged(Plugin(["not a backend"])) as m:
        assert "reference" in m.backends()
        assert any("not a Backend" in v for v in m.broken.values())


def test_a_misspelled_hook_is_warned_about():
    class Typo:
        @hookimpl
        def poot_backend(self):  # poot_backends
            return [FakeBackend("typo", 1)]

    with pytest.warns(UserWarning, match="poot_backend, which is not a poot hook"):
        with plugged(Typo()) as m:
            assert any("misspelled" in v for v in m.broken.values())


def test_a_raising_probe_is_a_reason_not_a_crash(capsys):
    class Exploding(FakeBackend):
        def probe(self):
            raise RuntimeError("driver exploded")

    from poot.cli import main
    from poot.plugin import probe

    b = Exploding("exploding", 1)
    assert probe(b) == ([], "probe() raised RuntimeError: driver exploded")
    with plugged(Plugin([b])):
        assert main(["backends"]) == 0
        with pytest.raises(DeviceUnavailable, match="driver exploded"):
            select_backend("exploding")
    assert "no device: probe() raised RuntimeError: driver exploded" in capsys.readouterr().out


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
    assert m.broken == {"exploding": "failed to import: ImportError: No module named "
                                     "'poot_exploding'"}
    assert "reference" in m.backends()
    monkeypatch.setattr("poot.plugin._manager", m)
    # asking for it by name says that its plugin failed to load, and why
    with pytest.raises(UnknownBackend, match="its plugin failed to load .*No module named"):
        get_backend("exploding")
    # so does a packed format such a plugin would have registered
    from poot.errors import FormatError
    from poot.formats import get_format

    with pytest.raises(FormatError, match="'gguf:Q4_0'.*plugins that failed to load: "
                                          "exploding: failed to import: ImportError"):
        get_format("gguf:Q4_0")


def test_poot_conformance_names_a_plugin_that_failed_to_load(monkeypatch, capsys):
    class EP:
        name = "exploding"

        def load(self):
            raise ImportError("No module named 'poot_exploding'")

    import importlib_metadata
    from poot.cli import main

    monkeypatch.setattr(importlib_metadata, "entry_points", lambda group: [EP()])
    monkeypatch.setattr("poot.plugin._manager", PluginManager())
    assert main(["conformance", "exploding"]) != 0
    err = capsys.readouterr().err
    assert "its plugin failed to load" in err and "No module named 'poot_exploding'" in err


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


def test_select_skips_what_the_child_found_unusable_without_probing_it(monkeypatch):
    import poot.plugin

    class Counted(FakeBackend):
        probes = 0

        def probe(self):
            Counted.probes += 1
            return super().probe()

    gpu, low = Counted("fake-gpu", 50), FakeBackend("fake-low", 40)
    kind = f"{Counted.__module__}.{Counted.__qualname__}"
    monkeypatch.setattr(poot.plugin, "_child_answer", {"fake-gpu": [kind, False]})
    with plugged(Plugin([gpu, low])):
        assert select_backend()[0] is low and Counted.probes == 0
        # the child's word holds only for a backend of the class it probed
        monkeypatch.setattr(poot.plugin, "_child_answer", {"fake-gpu": ["other.Class", False]})
        assert select_backend()[0] is gpu and Counted.probes == 1


def test_the_child_reports_every_installed_backend():
    import poot.plugin

    found = poot.plugin._usable_in_child()
    assert set(found) == set(manager().backends()) - {
        n for n, p in manager().backend_plugins.items() if p.startswith("test-plugin-")}
    assert found["reference"][1] is True
    assert found["reference"][0] == poot.plugin._kind(get_backend("reference"))


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
    assert "dtypes: f32:storage+convert+arith+dot" in out
    assert f"Binary 1/{len(BinaryOp)}" in out
    assert "fake-none (priority 3" in out and "no device: no fake driver" in out
    assert "reference (priority 0, numpy, plugin poot.reference-backend, poot-core " in out
    assert "plugins that failed to load:" in out and "cannot load" in out
    assert out.index("fake-gpu") < out.index("fake-none") < out.index("reference")


def test_poot_backends_full_table(capsys):
    from poot.cli import main

    assert main(["backends", "--table"]) == 0
    assert "| Binary.Add |" in capsys.readouterr().out
