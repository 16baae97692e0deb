"""One plan as one translation unit: every distinct kernel function once, then
`void poot_step(char *const *R)` that runs the whole step inside one OpenMP parallel
region: each kernel's workgroups are shared out among the threads (`omp for nowait`),
a barrier goes only between calls that depend on each other (`Hazards`), copies run on
one thread.

`R` holds the base address of every buffer the plan binds (regions, then the step's
scratch), in `StepSource.buffers` order; every offset is a constant of the source, so
the same plan always prints the same source and reuses its cached library.
"""
from __future__ import annotations

from dataclasses import dataclass

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
    barriers: int = 0


class Hazards:
    """Byte ranges read and written since the last barrier. Kernels end without a barrier
    (`omp for nowait`); a barrier goes in front of a call only when it reads what an
    earlier unsynchronized call writes, or writes what one reads or writes."""

    def __init__(self):
        self.reads: list[tuple[int, int, int]] = []
        self.writes: list[tuple[int, int, int]] = []

    @staticmethod
    def _overlap(a, ranges) -> bool:
        return any(a[0] == b[0] and a[1] < b[2] and b[1] < a[2] for b in ranges)

    def conflicts(self, reads, writes) -> bool:
        return any(self._overlap(r, self.writes) for r in reads) or \
            any(self._overlap(w, self.writes) or self._overlap(w, self.reads) for w in writes)

    def add(self, reads, writes) -> None:
        self.reads += reads
        self.writes += writes

    def clear(self) -> None:
        self.reads, self.writes = [], []


def build_step(plan) -> StepSource:
    regions = list(plan.regions)
    index = {name: i for i, name in enumerate(regions)}
    scratch_slot = len(regions)
    body, defs, seen = [], [], set()
    hazards = Hazards()
    scratch_bytes = scratch_top = 0     # scratch is handed out afresh after each barrier
    printer = HostCPrinter()

    def span(place) -> tuple[int, int, int]:
        return (index[place.region], place.offset, place.offset + max(place.nbytes, 1))

    def ptr(place, ctype: str = "char") -> str:
        if place.strides is not None:
            raise UnsupportedOp(f"cpu kernels read contiguous operands; the plan gave a strided "
                                f"view {place}", backend="cpu")
        return f"(({ctype}*)(R[{index[place.region]}] + {place.offset}))"

    def barrier_for(reads, writes) -> None:
        nonlocal scratch_top
        if hazards.conflicts(reads, writes):
            body.append("    #pragma omp barrier")
            hazards.clear()
            scratch_top = 0

    def copy(dst, src) -> None:
        barrier_for([span(src)], [span(dst)])
        body.append(f"    #pragma omp single\n    memcpy({ptr(dst)}, {ptr(src)}, {dst.nbytes});")
        hazards.clear()              # a single construct ends with a barrier

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
                copy(dst, src)
        sizes = {b.name: -(-b.nbytes // SCRATCH_ALIGN) * SCRATCH_ALIGN for b in low.scratch}
        operand_reads = [span(p) for i, p in operands.items() if i != OUT]
        out_write = [span(step.out)]
        barrier_for(operand_reads, out_write)
        scratch = {}
        for name, size in sizes.items():
            scratch[name] = scratch_top
            scratch_top += size
        scratch_bytes = max(scratch_bytes, scratch_top)
        scratch_spans = [(scratch_slot, o, o + sizes[n]) for n, o in scratch.items()]
        for j, fn in enumerate(compiled.kernels):
            if j:                     # kernels of one eqn run in order
                body.append("    #pragma omp barrier")
                hazards.clear()
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
            hazards.add(operand_reads + scratch_spans, out_write + scratch_spans)
            calls += 1
    for c in plan.copies:
        copy(c.dst, c.src)
    barriers = sum(line.strip() == "#pragma omp barrier" for line in body)
    simd = any("POOT_AVX2" in d or "poot_h2f" in d for d in defs)
    source = "\n".join([printer.prelude(simd), *defs,
                        "void poot_step(char *const *R) {",
                        "  #pragma omp parallel",
                        "  {",
                        *body,
                        "  }",
                        "}", ""])
    return StepSource(source, regions, scratch_bytes, len(defs), calls, barriers)
