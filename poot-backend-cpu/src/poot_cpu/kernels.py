"""Plan-time lowering of one eqn: kernel programs (the shared lowerings, or the packed
GEMV builder for decode-shaped packed contractions) printed as C functions.

Nothing is compiled here: the runtime compiles every function of a plan in one
translation unit (poot_cpu.step), so a plan costs one compiler run.
"""
from __future__ import annotations

from dataclasses import dataclass

from poot.codegen.lower import lower as lower_program
from poot.codegen.program import Buffer, Lowering

from poot_cpu.printer import HostCPrinter


@dataclass(frozen=True)
class Function:
    """One printed C function: `name(buffers...)`, a kernel's work-shared group loop."""

    name: str
    source: str
    buffers: tuple[Buffer, ...]


@dataclass(frozen=True)
class CpuLowering:
    """What the runtime needs of one planned eqn: its C functions in dispatch order and the
    shared lowering's scratch buffers and in-place alias."""

    kind: str
    functions: tuple[Function, ...]
    scratch: tuple[Buffer, ...] = ()
    alias: int | None = None
    launch: str = ""


def print_lowering(lowering: Lowering, device) -> CpuLowering:
    printer = HostCPrinter(str(device))
    funcs = tuple(Function(k.name, printer.source(k), k.buffers) for k in lowering.kernels)
    launch = "; ".join(f"{k.grid}x{k.workgroup}" for k in lowering.kernels)
    kind = lowering.kernels[0].name.split("_")[1] if lowering.kernels else "alias"
    return CpuLowering(kind, funcs, lowering.scratch, lowering.alias, launch)


def lower_eqn(op, ins, out, device) -> CpuLowering:
    """The eqn's C functions: a CPU-shaped source builder where one applies (packed
    contractions, attention), else the shared lowering printed by the host C printer
    (which refuses what it cannot print)."""
    from poot_cpu.attention import attention_lowering
    from poot_cpu.gemv import gemv_lowering

    for builder in (gemv_lowering, attention_lowering):
        fast = builder(op, ins, out)
        if fast is not None:
            return fast
    return print_lowering(lower_program(op, ins, out), device)
