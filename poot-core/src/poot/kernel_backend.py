"""The base of every backend that prints kernel programs (CUDA, WGSL, HIP, GLSL, C).

`KernelBackend.lower` is the one plan-time sequence they share, for each eqn:

    check    the device's capability table refuses what it does not declare (typed
             errors naming op, dtype, backend and device), before anything is built
    lower    the backend's own program for the eqn's signature where it has one
             (`program_for`), else poot.codegen.lower turns the eqn into backend-neutral
             kernel programs, using the schedules the target's `features` open
    print    the backend's printer (a dialect of poot.codegen.printer) prints each one
    compile  the backend's compiler call turns each source into what its runtime loads
    wrap     a `poot.contract.Lowering` whose program is a `CompiledProgram`

Eqns of one signature share the lowering of the first (`lower`'s cache), whichever of the
two made it.

A backend supplies only what is its own:

    capability_table(device, formats)  its capability facts (cached here per device and
                                       set of registered packed formats)
    features(device)                   the target's optional statement families
    schedule(device)                   the contraction schedules' tuning (default: the
                                       one its features imply)
    printer(device)                    its language's printer
    compile(kernel, source, device)    its compiler call -> a `CompiledKernel`
    runtime(device)                    its runtime (poot.contract.Runtime)

plus `probe`, `unavailable_reason` and the class attributes of any Backend; and, where
it has kernels of its own for some signatures (the cpu backend's packed GEMV, attention
and ArgTopK source builders):

    program_for(op, operands, out, device)   its compiled program, or None for the
                                             shared lowering
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from poot.capability import CapabilityTable
from poot.codegen.program import Kernel, KernelProgram
from poot.contract import Backend, Device, Lowering


@dataclass(frozen=True)
class CompiledKernel:
    """One kernel program, its printed source and what the compiler made of it.

    `binary` is the compiler's product (a CUBIN, a code object; None where the runtime
    builds its pipelines from the source itself); `groups` the workgroup counts it is
    dispatched with (the program's grid, or the grid folded to fit a device limit);
    `dynamic_shared` bytes of workgroup memory sized at launch (0: static).
    """

    kernel: Kernel
    source: str
    binary: Any = None
    groups: tuple[int, int, int] | None = None
    dynamic_shared: int = 0

    @property
    def name(self) -> str:
        return self.kernel.name

    @property
    def buffers(self):
        return self.kernel.buffers

    @property
    def launch(self) -> str:
        grid = self.kernel.grid if self.groups in (None, self.kernel.grid3()) else self.groups
        return f"{grid}x{self.kernel.workgroup}"


@dataclass(frozen=True)
class CompiledProgram:
    """A planned eqn's kernel programs, compiled for one target, in dispatch order."""

    program: KernelProgram
    kernels: tuple[CompiledKernel, ...]
    target: str

    @property
    def launch(self) -> str:
        return "; ".join(k.launch for k in self.kernels)

    @property
    def label(self) -> str:
        """What `poot plan` shows: the kernels' names, or "alias" when there are none."""
        return ",".join(k.name for k in self.kernels) or "alias"


#: lowerings a backend keeps for reuse by later eqns of the same signature
SHARED_LOWERINGS = 1024


class KernelBackend(Backend):
    """A backend that prints poot.codegen kernel programs; see the module docstring."""

    # -- what a backend supplies ---------------------------------------------------
    def capability_table(self, device: Device, formats: frozenset[str]) -> CapabilityTable:
        """The capability table of `device` with these packed formats registered."""
        raise NotImplementedError(f"backend {self.name} declares no capability table")

    def features(self, device: Device) -> frozenset:
        """The optional statement families the target prints (poot.codegen.program)."""
        return frozenset()

    def schedule(self, device: Device):
        """The contraction schedules' tuning on `device` (a poot.codegen.lower.schedule.
        DotSchedule), or None for the default its features imply."""
        return None

    def printer(self, device: Device):
        """The printer of the target's language (a poot.codegen.printer.Printer)."""
        raise NotImplementedError(f"backend {self.name} has no printer")

    def compile(self, kernel: Kernel, source: str, device: Device) -> CompiledKernel:
        """Compile one printed kernel. The default keeps the source for the runtime."""
        return CompiledKernel(kernel, source)

    def program_for(self, op, operands: Sequence, out, device: Device) -> CompiledProgram | None:
        """The backend's own compiled program for this signature (`operands`: each
        operand's TensorType, or its Lit), called after the capability check; None (the
        default) lowers it through poot.codegen.lower."""
        return None

    # -- the shared sequence ---------------------------------------------------------
    def capabilities(self, device: Device) -> CapabilityTable:
        from poot.formats import formats

        key = (device, frozenset(formats()))
        tables = self.__dict__.setdefault("_tables", {})
        if key not in tables:
            tables[key] = self.capability_table(device, key[1])
        return tables[key]

    def lower(self, eqn, graph, device: Device) -> Lowering:
        """check -> lower -> print -> compile -> wrap, all at plan time, so that every
        refusal (dtype, limit, compiler) comes before anything runs. Eqns of one signature
        (op, operand types and literals, output type) share one lowering: a model's layers
        repeat a few signatures, and building a GEMV's program is the slow part of a plan."""
        from poot.capability import operand_types
        from poot.ir.graph import Lit

        types = operand_types(graph, eqn)
        out = graph.type_of(eqn.out)
        self.capabilities(device).check(eqn.op, types, out)
        operands = tuple(x if isinstance(x, Lit) else t
                         for x, t in zip(eqn.inputs, types, strict=True))
        key = (_op_key(eqn.op), operands, out, device)
        try:
            hash(key)
        except TypeError:            # an op holding unhashable parameters: never shared
            return self._lowering(eqn.op, operands, out, device)
        done = self.__dict__.setdefault("_lowerings", {})
        if key not in done:
            if len(done) >= SHARED_LOWERINGS:      # a long-lived backend plans many graphs
                done.clear()
            done[key] = self._lowering(eqn.op, operands, out, device)
        return done[key]

    def forget_lowerings(self) -> None:
        """Drop the shared lowerings (after changing a schedule's parameters)."""
        self.__dict__.pop("_lowerings", None)

    def _lowering(self, op, operands, out, device: Device) -> Lowering:
        compiled = self.program_for(op, list(operands), out, device)
        if compiled is None:
            compiled = self.build(self._program(op, operands, out, device), device)
        return Lowering(compiled.label, compiled.launch, compiled,
                        dispatches=len(compiled.kernels),
                        extra={"alias": compiled.program.alias})

    def _program(self, op, operands, out, device: Device) -> KernelProgram:
        from poot.codegen.lower import lower
        from poot.errors import LoweringError

        try:   # a kernel lowering's own refusal (a limit, a body it cannot hold)
            return lower(op, list(operands), out, self.features(device), self.schedule(device))
        except LoweringError as exc:
            table = self.capabilities(device)
            raise exc.on(table.backend, table.device) from None

    def build(self, program: KernelProgram, device: Device) -> CompiledProgram:
        """Print and compile every kernel of `program` for `device`."""
        printer = self.printer(device)
        kernels = tuple(self.compile(k, printer.source(k), device) for k in program.kernels)
        return CompiledProgram(program, kernels, printer.device or str(device))


def _op_key(op):
    """What identifies an op's lowering: the op itself, but an op holding a region (a
    Graph, compared by identity) by its other parameters and the region's text."""
    import dataclasses

    from poot.ir.graph import Graph

    if not dataclasses.is_dataclass(op) or not any(
            isinstance(getattr(op, f.name), Graph) for f in dataclasses.fields(op)):
        return (type(op), op)
    parts = []
    for f in dataclasses.fields(op):
        v = getattr(op, f.name)
        parts.append((f.name, str(v) if isinstance(v, Graph) else _op_key(v)
                      if dataclasses.is_dataclass(v) else v))
    return (type(op), tuple(parts))


__all__ = ["CompiledKernel", "CompiledProgram", "KernelBackend"]
