"""Compiled kernels on a HIP device.

Plan time (no GPU needed) is poot.kernel_backend's: each eqn becomes a
`CompiledProgram` whose kernels' `binary` is a `compiler.CodeRef` (the kernels of
one eqn are built as one hiprtc unit). `bind` is the load-time half: modules loaded
once per device, each kernel's buffer parameters resolved to device pointers,
ready to launch or capture.
"""
from __future__ import annotations

from poot.codegen.program import KernelProgram
from poot.kernel_backend import CompiledKernel, CompiledProgram

from poot_rocm import compiler
from poot_rocm.driver import Context, Launch
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


class ModuleCache:
    """One loaded module per code object per device."""

    def __init__(self, ctx: Context):
        self.ctx, self._modules = ctx, {}

    def function(self, ck: CompiledKernel):
        code = ck.binary.load()
        mod = self._modules.get(code)
        if mod is None:
            mod = self._modules[code] = self.ctx.load_module(code)
        return self.ctx.function(mod, ck.kernel.name)


def bind(compiled: CompiledProgram, modules: ModuleCache, operand_ptrs: dict[int, int],
         scratch_ptrs: dict[str, int]) -> list[Launch]:
    """Launches with every buffer parameter resolved: operands by index (OUT for the
    output), scratch buffers by name."""
    launches = []
    for ck in compiled.kernels:
        ptrs = [scratch_ptrs[b.name] if b.operand is None else operand_ptrs[b.operand]
                for b in ck.kernel.buffers]
        launches.append(Launch(modules.function(ck), ck.kernel.grid, ck.kernel.workgroup, ptrs,
                               ck.kernel.name))
    return launches


__all__ = ["CompiledKernel", "CompiledProgram", "ModuleCache", "bind", "compile_program"]
