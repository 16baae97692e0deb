"""One plan as one translation unit: every distinct kernel function once, then
`void poot_step(char *const *R)` that runs the whole step inside one OpenMP parallel
region: each kernel's workgroups are shared out among the threads (its `omp for`
ends with the barrier that orders it before the next), copies run on one thread.

`R` holds the base address of every buffer the plan binds (regions, then the step's
scratch), in `StepSource.buffers` order; every offset is a constant of the source, so
the same plan always prints the same source and reuses its cached library.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from poot.codegen.program import OUT
from poot.errors import UnsupportedOp
from poot.ir.graph import Lit
from poot.kernel_backend import CompiledProgram

from poot_cpu.printer import HostCPrinter

SCRATCH_ALIGN = 256


@dataclass
class StepSource:
    """The source and the buffer order of one plan's step function."""

    source: str
    regions: list[str]                 # R[i] for i < len(regions): plan regions by name
    scratch_bytes: int = 0             # R[len(regions)]: the step's scratch, when nonzero
    functions: int = 0
    calls: int = 0
    names: dict[str, int] = field(default_factory=dict)


def build_step(plan) -> StepSource:
    regions = list(plan.regions)
    index = {name: i for i, name in enumerate(regions)}
    scratch_slot = len(regions)
    body, defs, seen = [], [], set()
    scratch_bytes = 0
    printer = HostCPrinter()

    def ptr(place, ctype: str = "char") -> str:
        if place.strides is not None:
            raise UnsupportedOp(f"cpu kernels read contiguous operands; the plan gave a strided "
                                f"view {place}", backend="cpu")
        return f"(({ctype}*)(R[{index[place.region]}] + {place.offset}))"

    def copy(dst: str, src: str, nbytes: int) -> None:
        body.append(f"    #pragma omp single\n    memcpy({dst}, {src}, {nbytes});")

    calls = 0
    for step in plan.steps:
        compiled = step.lowering.program
        if not isinstance(compiled, CompiledProgram):
            raise UnsupportedOp(f"step {step.index} ({step.eqn.op.name}) was not lowered by "
                                "the cpu backend", op=step.eqn.op.name, backend="cpu")
        operands = {i: p for i, p in enumerate(step.inputs) if not isinstance(p, Lit)}
        operands[OUT] = step.out
        low = compiled.program
        if low.alias is not None and low.kernels and not step.inplace:
            src, dst = operands[low.alias], step.out
            if (src.region, src.offset) != (dst.region, dst.offset):
                copy(ptr(dst), ptr(src), dst.nbytes)
        scratch, offset = {}, 0
        for b in low.scratch:
            scratch[b.name] = offset
            offset += -(-b.nbytes // SCRATCH_ALIGN) * SCRATCH_ALIGN
        scratch_bytes = max(scratch_bytes, offset)
        for fn in compiled.kernels:
            if fn.name not in seen:
                seen.add(fn.name)
                defs.append(fn.source)
            args = []
            for b in fn.buffers:
                t = printer.type_name(b.dtype)
                if b.operand is None:
                    args.append(f"(({t}*)(R[{scratch_slot}] + {scratch[b.name]}))")
                else:
                    args.append(ptr(operands[b.operand], t))
            body.append(f"    {fn.name}({', '.join(args)});  /* step {step.index} */")
            calls += 1
    for c in plan.copies:
        copy(ptr(c.dst), ptr(c.src), c.src.nbytes)
    source = "\n".join([printer.prelude(), *defs,
                        "void poot_step(char *const *R) {",
                        "  #pragma omp parallel",
                        "  {",
                        *body,
                        "  }",
                        "}", ""])
    return StepSource(source, regions, scratch_bytes, len(defs), calls)
