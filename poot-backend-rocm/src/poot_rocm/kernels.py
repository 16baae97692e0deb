"""Compiled kernels on a HIP device.

Plan time (no GPU needed) is poot.kernel_backend's: each eqn becomes a
`CompiledProgram` whose kernels' `binary` is a `compiler.CodeRef` (the kernels of
one eqn are built as one hiprtc unit). `bind` is the load-time half: modules loaded
once per device and each kernel's buffer parameters resolved to device pointers
(poot.simt_backend), ready to launch or capture.
"""
from __future__ import annotations

from poot.codegen.program import KernelProgram
from poot.kernel_backend import CompiledKernel, CompiledProgram
from poot.simt_backend import ModuleCache as SimtModuleCache
from poot.simt_backend import bound_kernels

from poot_rocm import compiler
from poot_rocm.driver import Launch
from poot_rocm.printer import HipPrinter
from poot_rocm.toolchain import require


def compile_program(program: KernelProgram, printer: HipPrinter) -> CompiledProgram:
    """Print every kernel of `program` for the printer's target and build them as one
    unit (or leave them to an open `compiler.batch()`)."""
    t = printer.target
    require(t.arch.name)         # a target the toolchain cannot build: typed refusal now
    printed = [(k, printer.source(k)) for k in program.kernels]
    compiler.build([(k.name, src) for k, src in printed], t)
    kernels = tuple(CompiledKernel(k, src, compiler.CodeRef(compiler.cache_key(src, t), k.name))
                    for k, src in printed)
    return CompiledProgram(program, kernels, t.name)


class ModuleCache(SimtModuleCache):
    """One loaded module per code object per device."""

    def code(self, ck: CompiledKernel) -> bytes:
        """The code object of `ck`, from the build cache (its binary is a CodeRef)."""
        return ck.binary.load()


def bind(compiled: CompiledProgram, modules: ModuleCache, operand_ptrs: dict[int, int],
         scratch_ptrs: dict[str, int]) -> list[Launch]:
    """Launches with every buffer parameter resolved: operands by index (OUT for the
    output), scratch buffers by name."""
    return [Launch(function, ck.kernel.grid, ck.kernel.workgroup, list(ptrs.values()),
                   ck.kernel.name)
            for ck, function, ptrs in bound_kernels(compiled, modules, operand_ptrs,
                                                    scratch_ptrs)]


__all__ = ["CompiledKernel", "CompiledProgram", "ModuleCache", "bind", "compile_program"]
