"""The Backend contract: what a plugin's `poot_backends()` hook returns.

A backend is found through the `poot` entry point group (see poot.plugin). It

1. finds its devices: `probe()` returns Device records, or an empty list with
   `unavailable_reason()` saying why ("no CUDA device: cuInit failed: ...");
   it never hangs and never raises for a missing driver;
2. declares, per device, a `CapabilityTable` (poot.capability): dtype uses, and
   for each op key the dtypes or packed formats it lowers;
3. lowers, at plan time, one eqn (a primitive, a fused region or another
   composite) to a `Lowering`: the kernel it chose and its launch shape. It
   raises the typed refusal (DtypeLowering, UnsupportedOp, LimitExceeded) for
   anything its table does not declare, before anything runs;
4. runs plans: `runtime(device)` returns a Runtime (memory, upload, launch,
   record/replay). See poot.runtime for the Runtime protocol.

Subclass `Backend` and override what differs; the conformance suite
(`pytest --pyargs poot.conformance --poot-backend NAME`) checks the result.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from poot.errors import DeviceUnavailable

if TYPE_CHECKING:  # pragma: no cover
    from poot.capability import CapabilityTable
    from poot.ir.graph import Eqn, Graph


@dataclass(frozen=True)
class Device:
    """One device a backend found. `info` holds facts such as arch or memory."""

    backend: str
    index: int
    name: str
    info: tuple[tuple[str, Any], ...] = ()

    @property
    def id(self) -> str:
        return f"{self.backend}:{self.index}"

    def __str__(self) -> str:
        return f"{self.id} ({self.name})"


@dataclass
class Lowering:
    """A backend's plan-time choice for one eqn: the kernel and its launch shape.

    `kernel` is a short name a person reads in `poot plan` ("gemv", "fused_row",
    "alias"); `launch` a printable shape (grid, workgroup); `program` whatever the
    backend's runtime needs later (a poot.codegen Kernel, source text, a callable).
    `dispatches` is 0 for aliases (Reshape) that need no work.
    """

    kernel: str
    launch: str = ""
    program: Any = None
    dispatches: int = 1
    extra: dict = field(default_factory=dict)

    def __str__(self) -> str:
        return f"{self.kernel}{f' [{self.launch}]' if self.launch else ''}"


class Backend:
    """Base class of backends. `name` must be unique among installed backends."""

    name: str = "backend"
    #: higher is preferred when compile/plan pick a backend automatically
    priority: int = 0
    #: the short kind of code it runs ("numpy", "cuda", "wgsl", "spirv")
    language: str = ""

    def probe(self) -> "list[Device]":
        """The devices this backend can use now (cached by the caller). Never raises."""
        return []

    def unavailable_reason(self) -> str | None:
        """Why `probe()` found no device, in one line; None when it found some."""
        return None

    def capabilities(self, device: Device) -> "CapabilityTable":
        raise NotImplementedError(f"backend {self.name} declares no capability table")

    def lower(self, eqn: "Eqn", graph: "Graph", device: Device) -> Lowering:
        """Choose the kernel for one eqn of `graph` (types via graph.type_of).

        The default checks the capability table and names the op; backends
        override to attach their kernel program.
        """
        from poot.capability import op_key
        from poot.ir.graph import Lit

        ins = [x.type if isinstance(x, Lit) else graph.type_of(x.id) for x in eqn.inputs]
        self.capabilities(device).check(eqn.op, ins, graph.type_of(eqn.out))
        return Lowering(op_key(eqn.op))

    def runtime(self, device: Device):
        """A runtime for `device` (see poot.runtime.Runtime)."""
        raise NotImplementedError(f"backend {self.name} has no runtime")

    def default_device(self) -> Device:
        devs = self.probe()
        if not devs:
            raise DeviceUnavailable(f"backend {self.name} has no device: "
                                    f"{self.unavailable_reason() or 'unknown reason'}")
        return devs[0]


def backends() -> "dict[str, Backend]":
    """Every installed backend, by name."""
    from poot.plugin import manager

    return manager().backends()


def get_backend(name: str) -> Backend:
    from poot.errors import UnknownBackend

    table = backends()
    if name not in table:
        raise UnknownBackend(f"unknown backend {name!r}; installed: {', '.join(sorted(table))}")
    return table[name]


def select_backend(name: str | None = None) -> tuple[Backend, Device]:
    """The named backend's first device, or the best available one (highest priority
    backend that finds a device; the reference backend always does)."""
    if name is not None:
        b = get_backend(name)
        return b, b.default_device()
    for b in sorted(backends().values(), key=lambda b: -b.priority):
        devs = b.probe()
        if devs:
            return b, devs[0]
    raise DeviceUnavailable("no backend finds a device (the reference backend should always)")
