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
   record/replay). See poot.runtime.protocol for the Runtime contract;
5. tells the planner (poot.plan) how it wants memory laid out: `Lowering.strided_inputs`
   (a Transpose may reach the kernel as a strided view) and `bind_time` (a constant eqn
   is evaluated once on the host at bind time and cached as a weight).

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
    def is_software(self) -> bool:
        """A device emulated on the CPU (e.g. Mesa lavapipe): real shaders, CPU speed."""
        kind = str(dict(self.info).get("adapter_type", dict(self.info).get("device_type", "")))
        return kind.lower() == "cpu"

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
    `strided_inputs` says the kernel reads its operands through element strides, so the
    planner may hand it a Transpose as a strided view instead of a copy.
    """

    kernel: str
    launch: str = ""
    program: Any = None
    dispatches: int = 1
    extra: dict = field(default_factory=dict)
    strided_inputs: bool = False

    def __str__(self) -> str:
        return f"{self.kernel}{f' [{self.launch}]' if self.launch else ''}"


class Backend:
    """Base class of backends. `name` must be unique among installed backends."""

    name: str = "backend"
    #: higher is preferred when compile/plan pick a backend automatically
    priority: int = 0
    #: the short kind of code it runs ("numpy", "cuda", "wgsl", "spirv")
    language: str = ""

    def probe(self) -> list[Device]:
        """The devices this backend can use now (cached by the caller). Never raises."""
        return []

    def unavailable_reason(self) -> str | None:
        """Why `probe()` found no device, in one line; None when it found some."""
        return None

    def capabilities(self, device: Device) -> CapabilityTable:
        raise NotImplementedError(f"backend {self.name} declares no capability table")

    def lower(self, eqn: Eqn, graph: Graph, device: Device) -> Lowering:
        """Choose the kernel for one eqn of `graph` (types via graph.type_of).

        The default checks the capability table and names the op; backends
        override to attach their kernel program.
        """
        from poot.capability import op_key
        from poot.ir.graph import Lit

        ins = [x.type if isinstance(x, Lit) else graph.type_of(x.id) for x in eqn.inputs]
        self.capabilities(device).check(eqn.op, ins, graph.type_of(eqn.out))
        return Lowering(op_key(eqn.op), strided_inputs=self.host_kernels)

    @property
    def host_kernels(self) -> bool:
        """True when this backend's kernels are host numpy calls over views of its
        buffers (the reference backend): they read strided views, and folding a
        constant eqn on the host at bind time costs nothing on the device."""
        return self.language == "numpy"

    def bind_time(self, eqn: Eqn, graph: Graph, device: Device) -> str | None:
        """Whether to evaluate `eqn`, whose operands are all constant (consts, computed
        values, literals or values folded before it), once at bind time on the host.

        Returns the storage representation of the folded result (a short name that goes
        into the weight cache key with the payload identities of its sources), or None to
        run the eqn on the device every step. The planner asks this only for eqns with
        constant operands. The default folds operand-less generators (Iota) everywhere,
        and every constant eqn on host-kernel backends, where a packed weight's storage
        representation is its decoded F32 matrix ("f32-decoded"). A GPU backend keeps
        packed weights packed (its contraction decodes them) and may leave this as is.
        """
        from poot.ir import ops as O

        if not eqn.inputs:
            return "computed"
        if not self.host_kernels:
            return None
        return "f32-decoded" if isinstance(eqn.op, O.PackedDequant) else "folded"

    def runtime(self, device: Device):
        """A runtime for `device` (see poot.runtime.Runtime)."""
        raise NotImplementedError(f"backend {self.name} has no runtime")

    def default_device(self) -> Device:
        devs = self.probe()
        if not devs:
            raise DeviceUnavailable(f"backend {self.name} has no device: "
                                    f"{self.unavailable_reason() or 'unknown reason'}")
        return devs[0]


def backends() -> dict[str, Backend]:
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
    """The named backend's first device, or the best available one: the highest-priority
    backend with a hardware device, else the reference backend. A software device (a
    GPU API emulated on the CPU, such as lavapipe) runs real shaders but slower than the
    reference backend's numpy, so it is used only when named."""
    if name is not None:
        b = get_backend(name)
        return b, b.default_device()
    for b in sorted(backends().values(), key=lambda b: -b.priority):
        devs = [d for d in b.probe() if not d.is_software or b.language == "numpy"]
        if devs:
            return b, devs[0]
    raise DeviceUnavailable("no backend finds a device (the reference backend should always)")
