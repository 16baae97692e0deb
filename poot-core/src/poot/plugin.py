"""The plugin manager: loads plugins, checks them against the hooks of `poot.contract`,
and keeps the registries they fill (backends, packed weight formats, slot roles).

Plugins come from the `poot` entry point group of installed packages, from the
plugins poot-core ships (`BUILTIN`, loaded by module name exactly like an entry
point), and from `register(obj)` (tests, scripts). A backend's plugin may instead be
in the `poot.backends` group (`BACKEND_GROUP`), named by the backend it registers: it is
imported when that backend is asked for by name, or when every backend is listed, so
that a run on one backend holds none of the others' code. A plugin that fails to import,
misspells a hook, or whose hook raises, returns a wrong type or re-registers a name
is recorded in `broken` (shown by `poot backends`) and hides no other plugin.
"""
from __future__ import annotations

import importlib
import threading
import warnings
from typing import TYPE_CHECKING

import pluggy

from poot import versions
from poot.contract import PROJECT, Backend, Device, PootHookSpecs, hookimpl, hookspec
from poot.errors import DeviceUnavailable, IncompatiblePlugin, PootError, UnknownBackend
from poot.ir.types import SlotKind

if TYPE_CHECKING:  # pragma: no cover
    from poot.formats import WeightFormat

#: the plugins poot-core ships: entry point name -> module (the reference backend, and the
#: owners of slot roles: the LoRA adapter index, the expert map, the in-graph sampler,
#: hosted embedding rows, a vision tower's pixels, M-RoPE's positions, Qwen2.5-VL's tower's
#: rotary tables and padding)
BUILTIN = {"poot.reference-backend": "poot.backends.reference",
           "poot.lora": "poot.models.lora", "poot.expert-pool": "poot.models.expert_pool",
           "poot.sampler": "poot.models.sample_graph",
           "poot.hosted-rows": "poot.models.hosted_rows",
           "poot.vision-pixels": "poot.models.vision.siglip",
           "poot.mrope": "poot.models.mrope",
           "poot.qwen25vl-tower": "poot.models.vision.qwen25vl"}
#: entry point group of backend plugins, each named by the backend it registers, imported
#: on demand: its other hooks (formats, slot roles, checkpoints) count only once it is, so
#: a plugin that owns any of those belongs in the `poot` group, which is loaded at once
BACKEND_GROUP = f"{PROJECT}.backends"
#: what each list-returning hook's items must be, for the broken-plugin report
_ITEM = {"poot_backends": (Backend, "a Backend"), "poot_slot_roles": (SlotKind, "a SlotKind")}


class PluginWarning(UserWarning):
    """A plugin defines a `poot_*` function that is not one of poot's hooks."""


class PluginManager:
    """poot's pluggy manager with cached registries of backends, formats and slot roles."""

    def __init__(self, load_entry_points: bool = True):
        self.pm = pluggy.PluginManager(PROJECT)
        self.pm.add_hookspecs(PootHookSpecs)
        #: plugins that failed to load or whose hook misbehaved: name -> error line
        self.broken: dict[str, str] = {}
        #: plugin name -> "distribution version" it was installed from
        self.distributions: dict[str, str] = {}
        #: BACKEND_GROUP entry points not imported yet: backend name -> its loader
        self._lazy: dict[str, object] = {}
        for name, module in BUILTIN.items():
            self.distributions[name] = f"poot-core {versions.core_version()}"
            self._load(name, lambda m=module: importlib.import_module(m))
        if load_entry_points:
            self._load_entry_points()
        self._backends: dict[str, Backend] | None = None
        self._formats: dict[str, WeightFormat] | None = None
        self._roles: dict[str, SlotKind] | None = None
        #: backend name -> the name of the plugin that registered it (after `backends()`)
        self.backend_plugins: dict[str, str] = {}

    def _load_entry_points(self) -> None:
        try:  # the backport where installed, else the standard library (3.10+ API)
            from importlib_metadata import entry_points
        except ImportError:  # pragma: no cover - images without the backport
            from importlib.metadata import entry_points

        seen = set(BUILTIN)
        for ep in entry_points(group=PROJECT):
            if self.pm.get_plugin(ep.name) is None:
                self._load(ep.name, self._entry_loader(ep))
            seen.add(ep.name)
        for ep in entry_points(group=BACKEND_GROUP):
            if ep.name not in seen:
                self._lazy[ep.name] = self._entry_loader(ep)
                seen.add(ep.name)

    def _entry_loader(self, ep):
        """Record `ep`'s distribution; a loader that imports it after the version check."""
        dist = getattr(ep, "dist", None)
        if dist is not None:
            self.distributions[ep.name] = versions.label(dist)
        return lambda: self._checked_load(ep, dist)

    def _load_lazy(self, names) -> None:
        """Import and register the BACKEND_GROUP plugins `names` (those not loaded yet)."""
        loaded = [n for n in names if n in self._lazy]
        for name in loaded:
            self._load(name, self._lazy.pop(name))
        if loaded:
            self._backends = self._formats = self._roles = None
            self.slot_roles()

    @staticmethod
    def _checked_load(ep, dist):
        """Load an entry point after checking that its distribution was built for this
        poot-core (before importing any of its code)."""
        if dist is not None:
            versions.check_compatible(dist)
        return ep.load()

    def _load(self, name: str, load) -> None:
        """Import and register one plugin; a failure is recorded, never raised."""
        try:
            plugin = load()
        except IncompatiblePlugin as exc:
            self.broken[name] = str(exc)
            return
        except Exception as exc:  # a broken plugin is reported, not fatal
            self.broken[name] = f"failed to import: {type(exc).__name__}: {exc}"
            return
        self._add(plugin, name)

    def _add(self, plugin: object, name: str | None) -> None:
        unknown = sorted(a for a in dir(plugin) if a.startswith("poot_")
                         and callable(getattr(plugin, a, None))
                         and not hasattr(PootHookSpecs, a))
        if unknown:
            msg = (f"plugin {name or plugin!r} defines {', '.join(unknown)}, which is not a "
                   f"poot hook (the hooks: {', '.join(_hook_names())}); is it misspelled?")
            warnings.warn(msg, PluginWarning, stacklevel=3)
            self.broken[f"{name} (unknown hook)"] = msg
        try:
            self.pm.register(plugin, name=name)
        except Exception as exc:  # a hook with a wrong signature (pluggy's validation)
            self.broken[str(name)] = f"{type(exc).__name__}: {exc}"

    def failure(self, name: str) -> str | None:
        """Why the plugin called `name` (or registering a backend called `name`) is
        broken, or None."""
        for key, why in self.broken.items():
            if key == name or key.startswith(f"{name} ("):
                return f"{key}: {why}"
        return None

    def _each(self, hook: str):
        """(plugin name, items) from every implementation of a list-returning hook.
        An implementation that raises or returns anything but a list or tuple of the
        hook's items is recorded in `broken` and skipped."""
        want = _ITEM.get(hook)
        for impl in getattr(self.pm.hook, hook).get_hookimpls():  # in registration order
            where = f"{impl.plugin_name} ({hook})"
            try:
                items = impl.function()
            except Exception as exc:
                self.broken[where] = f"raised {type(exc).__name__}: {exc}"
                continue
            if items is None:
                continue
            if not isinstance(items, (list, tuple)):
                self.broken[where] = (f"returned {type(items).__name__} {items!r}, "
                                      "not a list")
                continue
            if want is not None and not all(isinstance(x, want[0]) for x in items):
                bad = next(x for x in items if not isinstance(x, want[0]))
                self.broken[where] = f"returned {bad!r}, not {want[1]}"
                continue
            yield impl.plugin_name, list(items)

    def register(self, plugin: object, name: str | None = None) -> None:
        """Register a plugin module or object; its slot roles are declared at once.
        Registering under a name already taken replaces that plugin (a re-imported module)."""
        if not self.pm.is_registered(plugin):
            old = self.pm.get_plugin(name) if name else None
            if old is not None:
                self.pm.unregister(old)
            self._add(plugin, name)
        self._backends = self._formats = self._roles = None
        self.slot_roles()

    def unregister(self, plugin: object) -> None:
        name = self.pm.get_name(plugin)
        self.pm.unregister(plugin)
        for key in [k for k in self.broken if name and (k == name or k.startswith(f"{name} ("))]:
            del self.broken[key]
        self._backends = self._formats = self._roles = None

    def backends(self) -> dict[str, Backend]:
        """Every registered backend by name (every BACKEND_GROUP plugin imported). A name
        two plugins register stays with the first registered; the second is recorded
        broken."""
        self._load_lazy(list(self._lazy))
        return self._registered()

    def backend(self, name: str) -> Backend | None:
        """The backend `name`, importing only its own BACKEND_GROUP plugin where one is
        named so (every plugin where none registers it), or None."""
        self._load_lazy([name])
        found = self._registered().get(name)
        return found if found is not None else self.backends().get(name)

    def _registered(self) -> dict[str, Backend]:
        """The backends of the plugins registered so far."""
        if self._backends is None:
            out: dict[str, Backend] = {}
            owner: dict[str, str] = {}
            for plugin, group in self._each("poot_backends"):
                for b in group:
                    if b.name in out:
                        self.broken[f"{plugin} (poot_backends)"] = (
                            f"registers a backend named {b.name!r}, which plugin "
                            f"{owner[b.name]} already registers; kept the first")
                        continue
                    out[b.name], owner[b.name] = b, plugin
            self._backends, self.backend_plugins = out, owner
        return self._backends

    def formats(self) -> dict[str, WeightFormat]:
        """Every registered packed weight format by name (a name registered twice stays
        with the first plugin; the second is recorded broken)."""
        if self._formats is None:
            out: dict[str, WeightFormat] = {}
            for plugin, group in self._each("poot_weight_formats"):
                for f in group:
                    if f.name in out and out[f.name] is not f:
                        self.broken[f"{plugin} (poot_weight_formats)"] = (
                            f"registers a format named {f.name!r} that another plugin "
                            "already registers; kept the first")
                        continue
                    out[f.name] = f
            self._formats = out
        return self._formats

    def slot_roles(self) -> dict[str, SlotKind]:
        """Owner-defined slot roles by label, each declared through `SlotKind.declare`.
        A role that conflicts with a role already declared under its label makes its
        plugin broken (recorded, not raised)."""
        if self._roles is None:
            out: dict[str, SlotKind] = {}
            for plugin, roles in self._each("poot_slot_roles"):
                for r in roles:
                    try:
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


def _hook_names() -> list[str]:
    return sorted(a for a in vars(PootHookSpecs) if a.startswith("poot_"))


_manager: PluginManager | None = None
_lock = threading.Lock()


def manager() -> PluginManager:
    """The process-wide plugin manager (plugins loaded on first use)."""
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


# -- the backend registry ----------------------------------------------------------------------
def backends() -> dict[str, Backend]:
    """Every installed backend, by name."""
    return manager().backends()


def get_backend(name: str) -> Backend:
    """The installed backend `name`; UnknownBackend lists the installed ones and says
    when a plugin of that name failed to load, and why."""
    found = manager().backend(name)
    if found is not None:
        return found
    table = backends()
    if name not in table:
        why = manager().failure(name)
        if why is not None:
            raise UnknownBackend(f"backend {name!r} is not available: its plugin failed to "
                                 f"load ({why})")
        raise UnknownBackend(f"unknown backend {name!r}; installed: {', '.join(sorted(table))}")
    return table[name]


def probe(backend: Backend) -> tuple[list[Device], str | None]:
    """(devices, reason none were found) of `backend`; a probe that raises finds no
    device, and the exception is the reason."""
    try:
        devices = list(backend.probe())
    except Exception as exc:  # the contract says probe never raises; report it if it does
        return [], f"probe() raised {type(exc).__name__}: {exc}"
    if devices:
        return devices, None
    try:
        reason = backend.unavailable_reason()
    except Exception as exc:
        reason = f"unavailable_reason() raised {type(exc).__name__}: {exc}"
    return [], reason or "no reason given"


def select_backend(name: str | None = None) -> tuple[Backend, Device]:
    """The named backend's first device, or the best available one: the highest-priority
    backend with a hardware device, else the reference backend. A software device (a
    GPU API emulated on the CPU, such as lavapipe) runs real shaders but slower than the
    reference backend's numpy, so it is used only when named."""
    if name is not None:
        b = get_backend(name)
        devs, why = probe(b)
        if not devs:
            raise DeviceUnavailable(f"backend {name} has no device: {why}")
        return b, devs[0]
    found = _usable_in_child()
    for b in sorted(backends().values(), key=lambda b: -b.priority):
        if found.get(b.name, (None,))[0] == _kind(b) and not found[b.name][1]:
            continue   # none usable: its driver is not loaded into this process to say so
        devs = [d for d in probe(b)[0] if _usable(b, d)]
        if devs:
            return b, devs[0]
    raise DeviceUnavailable("no backend finds a device (the reference backend should always)")


def _usable(b: Backend, d: Device) -> bool:
    return not d.is_software or b.language == "numpy"


def _kind(b: Backend) -> str:
    return f"{type(b).__module__}.{type(b).__qualname__}"


#: REPORT_MARK line of a child process: {backend name: [its class, has a usable device]}
REPORT_MARK = "poot-usable-backends "
_child_answer: dict[str, list] | None = None


def _usable_in_child() -> dict[str, list]:
    """Which installed backends have a usable device, probed once per process in a
    short-lived child: probing a GPU API loads its driver libraries (tens of MiB that stay
    mapped for the life of the process) even where the answer is no. Only a backend the
    child finds usable is probed here again, and only one the child knows, of the same
    class (not one a test or script registered). Empty where the child gives no answer:
    then every backend is probed here, as before."""
    global _child_answer
    if _child_answer is None:
        import json
        import subprocess
        import sys

        try:
            proc = subprocess.run([sys.executable, "-c", "import poot.plugin as p; "
                                   "p.report_usable()"], capture_output=True, text=True,
                                  timeout=120, stdin=subprocess.DEVNULL)
            line = next(x for x in reversed(proc.stdout.splitlines())
                        if x.startswith(REPORT_MARK))
            _child_answer = json.loads(line[len(REPORT_MARK):])
        except (OSError, subprocess.SubprocessError, StopIteration, ValueError):
            _child_answer = {}
    return _child_answer


def report_usable() -> None:
    """Print the REPORT_MARK line (what `_usable_in_child` runs in the child)."""
    import json

    table = {name: [_kind(b), any(_usable(b, d) for d in probe(b)[0])]
             for name, b in backends().items()}
    print(REPORT_MARK + json.dumps(table), flush=True)


__all__ = ["BUILTIN", "PluginManager", "PluginWarning", "hookimpl", "hookspec", "manager",
           "register", "unregister", "backends", "get_backend", "probe", "select_backend",
           "report_usable"]
