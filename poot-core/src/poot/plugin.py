"""The plugin seam: hook specifications and the plugin manager.

A plugin is an ordinary module (or object) with functions marked `@hookimpl`,
found through the `poot` entry point group of an installed package::

    [project.entry-points.poot]
    mybackend = "poot_mybackend.plugin"

or registered explicitly with `poot.plugin.register(module)` (tests, scripts).
Each hook below is a documented function signature; implement the ones you need.
A backend author reads this file, `poot.capability` and the conformance suite.
"""
from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

import pluggy

if TYPE_CHECKING:  # pragma: no cover
    from poot.backend import Backend
    from poot.formats import WeightFormat
    from poot.ir.types import SlotKind

PROJECT = "poot"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


class PootHookSpecs:
    """The hooks poot calls. Every hook is optional for a plugin."""

    @hookspec
    def poot_backends(self) -> list[Backend]:
        """Return the backends this plugin provides (instances of `poot.backend.Backend`).

        Return them even when they find no device: `Backend.probe()` says which
        devices it finds (never raising for a missing driver), `unavailable_reason()`
        why it finds none ("no CUDA device: ..."), and `poot backends` prints both.
        Per device, a backend declares a capability table (`Backend.capabilities`,
        see `poot.capability`), lowers each eqn or fused region at plan time
        (`Backend.lower`, raising the typed refusal of `poot.errors` for anything the
        table does not declare, before anything runs) and runs plans
        (`Backend.runtime`, the contract in `poot.runtime.protocol`). Check it with
        `pytest --pyargs poot.conformance --poot-backend NAME`; docs/backend-guide.md
        walks through a complete example.
        """

    @hookspec
    def poot_weight_formats(self) -> list[WeightFormat]:
        """Return the packed weight formats this plugin registers (see `poot.formats`).

        Names are global ("gguf:Q4_K", "gptq:int4", ...); two plugins registering
        the same name is an error.
        """

    @hookspec
    def poot_slot_roles(self) -> list[SlotKind]:
        """Return owner-defined slot roles (`SlotKind.declare(label, dtype, lo, hi)`).

        The IR knows Token, Pos, SlotMap and WriteMap; a role only a pass or a
        runtime feature needs (adapter index, expert map, sampler inputs) is
        declared by its owner here, with its label and its one type rule (dtype
        and value range, checked when a slot is bound). poot declares the roles
        when the plugin manager starts and whenever a plugin is registered, so a
        graph can use them (`SlotKind.get(label)`); a role that conflicts with one
        already declared under its label marks its plugin broken (`poot backends`).
        The conformance suite declares its own input roles this way.
        """

    @hookspec(firstresult=True)
    def poot_open_checkpoint(self, path: str, format_hint: str | None) -> Any:
        """Claim a checkpoint path and return an opened checkpoint, or None to pass.

        A checkpoint exposes `metadata` (dict), `tensors` (name -> TensorInfo with
        its PackedWeight descriptor or dtype, memory-mapped sources) and `close()`.
        poot-quant claims GGUF files and safetensors folders; the first plugin
        that returns a non-None value wins.
        """


class PluginManager:
    """poot's pluggy manager with cached registries of backends, formats and slot roles.

    A plugin that fails to load, or whose hook raises, is recorded in `broken`
    (name -> one error line, shown by `poot backends`) and never hides the others.
    """

    def __init__(self, load_entry_points: bool = True):
        self.pm = pluggy.PluginManager(PROJECT)
        self.pm.add_hookspecs(PootHookSpecs)
        from poot.backends import reference

        self.pm.register(reference, name="poot.reference-backend")
        #: plugins that failed to load or whose hook raised: name -> error line
        self.broken: dict[str, str] = {}
        if load_entry_points:
            self._load_entry_points()
        self._backends: dict[str, Backend] | None = None
        self._formats: dict[str, WeightFormat] | None = None
        self._roles: dict[str, SlotKind] | None = None
        #: backend name -> the name of the plugin that registered it (after `backends()`)
        self.backend_plugins: dict[str, str] = {}

    def _load_entry_points(self) -> None:
        """Load every `poot` entry point; one broken plugin never hides the others."""
        try:  # the backport where installed, else the standard library (3.10+ API)
            from importlib_metadata import entry_points
        except ImportError:  # pragma: no cover - images without the backport
            from importlib.metadata import entry_points

        for ep in entry_points(group=PROJECT):
            if self.pm.get_plugin(ep.name) is not None:
                continue
            try:
                self.pm.register(ep.load(), name=ep.name)
            except Exception as exc:  # a broken plugin is reported, not fatal
                self.broken[ep.name] = f"{type(exc).__name__}: {exc}"

    def _each(self, hook: str):
        """(plugin name, items) from every implementation of a list-returning hook;
        an implementation that raises is recorded in `broken` and skipped."""
        for impl in reversed(getattr(self.pm.hook, hook).get_hookimpls()):
            try:
                items = impl.function()
            except Exception as exc:
                self.broken[f"{impl.plugin_name} ({hook})"] = f"{type(exc).__name__}: {exc}"
                continue
            yield impl.plugin_name, list(items or ())

    def register(self, plugin: object, name: str | None = None) -> None:
        """Register a plugin module or object; its slot roles are declared at once.
        Registering under a name already taken replaces that plugin (a re-imported module)."""
        if not self.pm.is_registered(plugin):
            old = self.pm.get_plugin(name) if name else None
            if old is not None:
                self.pm.unregister(old)
            self.pm.register(plugin, name=name)
        self._backends = self._formats = self._roles = None
        self.slot_roles()

    def unregister(self, plugin: object) -> None:
        self.pm.unregister(plugin)
        self._backends = self._formats = self._roles = None

    def backends(self) -> dict[str, Backend]:
        """Every registered backend by name (two plugins with one name: a PootError)."""
        if self._backends is None:
            out: dict[str, Backend] = {}
            owner: dict[str, str] = {}
            for plugin, group in self._each("poot_backends"):
                for b in group:
                    if b.name in out:
                        from poot.errors import PootError

                        raise PootError(f"two plugins register a backend named {b.name!r}: "
                                        f"{owner[b.name]} and {plugin}")
                    out[b.name], owner[b.name] = b, plugin
            self._backends, self.backend_plugins = out, owner
        return self._backends

    def formats(self) -> dict[str, WeightFormat]:
        """Every registered packed weight format by name."""
        if self._formats is None:
            out: dict[str, WeightFormat] = {}
            for _plugin, group in self._each("poot_weight_formats"):
                for f in group:
                    if f.name in out and out[f.name] is not f:
                        from poot.errors import FormatError

                        raise FormatError(f"two plugins register a format named {f.name!r}")
                    out[f.name] = f
            self._formats = out
        return self._formats

    def slot_roles(self) -> dict[str, SlotKind]:
        """Owner-defined slot roles by label, each declared through `SlotKind.declare`.

        A role that is not a SlotKind, or that conflicts with a role already declared
        under its label, makes its plugin broken (recorded, not raised)."""
        if self._roles is None:
            from poot.errors import PootError
            from poot.ir.types import SlotKind

            out: dict[str, SlotKind] = {}
            for plugin, roles in self._each("poot_slot_roles"):
                for r in roles:
                    try:
                        if not isinstance(r, SlotKind):
                            raise PootError(f"poot_slot_roles returned {r!r}, not a SlotKind")
                        kind = SlotKind.declare(r.label, r.dtype, r.lo, r.hi, owner=r.owner,
                                                allows_negative_one=r.allows_negative_one)
                    except PootError as exc:
                        self.broken[f"{plugin} (poot_slot_roles)"] = str(exc)
                        continue
                    out[kind.label] = kind
            self._roles = out
        return self._roles

    def open_checkpoint(self, path: str, format_hint: str | None = None):
        return self.pm.hook.poot_open_checkpoint(path=path, format_hint=format_hint)


_manager: PluginManager | None = None
_lock = threading.Lock()


def manager() -> PluginManager:
    """The process-wide plugin manager (entry points loaded on first use)."""
    global _manager
    with _lock:
        if _manager is None:
            _manager = PluginManager()
            _manager.slot_roles()  # declare plugin-owned slot roles before any graph uses them
        return _manager


def register(plugin: object, name: str | None = None) -> None:
    """Register a plugin module or object that is not installed (tests, scripts)."""
    manager().register(plugin, name)


def unregister(plugin: object) -> None:
    manager().unregister(plugin)
