"""Helpers the CUDA tests and benchmarks share: the case catalog compiled once per process."""
from __future__ import annotations

import functools

from poot.codegen.cases import all_cases
from poot.codegen.lower import lower

from poot_cuda.capability import kernel_features, parse_arch
from poot_cuda.kernels import CompiledProgram, compile_program
from poot_cuda.printer import CudaPrinter

ARCH = "sm_90"


@functools.cache
def cases() -> tuple:
    return tuple(all_cases())


@functools.cache
def compiled(case_id: str, arch: str = ARCH) -> CompiledProgram:
    """A case lowered, printed and compiled once per process (and cached on disk)."""
    case = next(c for c in cases() if c.id == case_id)
    lowering = lower(case.op, case.ins, case.out(), kernel_features(*parse_arch(arch), arch))
    return compile_program(lowering, CudaPrinter(arch))
