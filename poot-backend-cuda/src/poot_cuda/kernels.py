"""Compiled kernels on a CUDA context.

Plan time (no GPU needed) is poot.kernel_backend's: each eqn becomes a
`CompiledProgram` of `CompiledKernel`s whose `binary` is a CUBIN. `bind` is the
load-time half: modules loaded once per context and each kernel's buffer parameters
resolved to device pointers (poot.simt_backend), each tensor map encoded, ready to launch
or capture.
"""
from __future__ import annotations

from poot.codegen.program import Kernel, KernelProgram
from poot.kernel_backend import CompiledKernel, CompiledProgram
from poot.simt_backend import ModuleCache, bound_kernels

from poot_cuda import compiler
from poot_cuda.driver import Launch
from poot_cuda.printer import CudaPrinter, dynamic_shared_bytes
from poot_cuda.tensor_map import encode


def compile_kernel(kernel: Kernel, source: str, arch: str) -> CompiledKernel:
    """One printed kernel as CUBIN, with the dynamic shared memory it launches with (inside
    a `compiler.batch()`, a `compiler.UnitRef` to it: compile-only checks)."""
    binary = (compiler.defer(source, kernel.name, arch) if compiler.batching() else
              compiler.compile_cubin(source, kernel.name, arch))
    return CompiledKernel(kernel, source, binary, dynamic_shared=dynamic_shared_bytes(kernel))


def compile_program(program: KernelProgram, printer: CudaPrinter) -> CompiledProgram:
    """Print and compile every kernel of `program` for the printer's arch, without a
    backend or device record (benchmarks, tests of single lowerings)."""
    kernels = tuple(compile_kernel(k, printer.source(k), printer.device)
                    for k in program.kernels)
    return CompiledProgram(program, kernels, printer.device)


def may_overlap(kernel, constants: frozenset[int]) -> bool:
    """Whether the kernel may start while the one before it runs: what it loads before its
    AwaitInputs (all of it, without one: nothing) is among `constants`."""
    early = kernel.early_reads()
    return early is None or early <= constants


def bind(compiled: CompiledProgram, modules: ModuleCache, operand_ptrs: dict[int, int],
         scratch_ptrs: dict[str, int], overlap: bool = False,
         constants: frozenset[int] = frozenset()) -> list[Launch]:
    """Launches with every buffer parameter resolved: operands by index (OUT for the
    output), scratch buffers by name, and each tensor map encoded over its buffer;
    `overlap`: programmatic dependent launches, except for a kernel that loads before
    its AwaitInputs an operand not among `constants` (one a step may write)."""
    launches = []
    for ck, function, ptrs in bound_kernels(compiled, modules, operand_ptrs, scratch_ptrs):
        maps = [encode(tm, ck.kernel.buffer(tm.buffer).dtype, ptrs[tm.buffer])
                for tm in ck.kernel.tensor_maps]
        launches.append(Launch(function, ck.kernel.grid, ck.kernel.workgroup,
                               list(ptrs.values()), ck.kernel.name, ck.dynamic_shared,
                               overlap and may_overlap(ck.kernel, constants),
                               maps))
    return launches


__all__ = ["CompiledKernel", "CompiledProgram", "ModuleCache", "bind", "compile_kernel",
           "compile_program", "may_overlap"]
