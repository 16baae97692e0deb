"""Compiled lowerings: a codegen Lowering printed as CUDA C and compiled to CUBIN.

`compile_lowering` is the plan-time half (it works without a GPU); `bind` is the
load-time half: modules loaded once per context, each kernel's buffer
parameters resolved to device pointers, ready to launch or capture.
"""
from __future__ import annotations

from dataclasses import dataclass

from poot.codegen.program import OUT, Kernel, Lowering

from poot_cuda.compiler import compile_cubin
from poot_cuda.driver import Context, Launch
from poot_cuda.printer import CudaPrinter, dynamic_shared_bytes


@dataclass(frozen=True)
class CompiledKernel:
    kernel: Kernel
    source: str
    cubin: bytes
    dynamic_shared: int = 0      # bytes of dynamic shared memory per workgroup


@dataclass(frozen=True)
class CompiledLowering:
    lowering: Lowering
    kernels: tuple[CompiledKernel, ...]
    arch: str

    @property
    def launch(self) -> str:
        return "; ".join(f"{k.kernel.grid}x{k.kernel.workgroup}" for k in self.kernels)


def compile_lowering(lowering: Lowering, printer: CudaPrinter) -> CompiledLowering:
    out = []
    for k in lowering.kernels:
        src = printer.source(k)
        out.append(CompiledKernel(k, src, compile_cubin(src, k.name, printer.device),
                                  dynamic_shared_bytes(k)))
    return CompiledLowering(lowering, tuple(out), printer.device)


class ModuleCache:
    """One loaded module per CUBIN per context."""

    def __init__(self, ctx: Context):
        self.ctx, self._modules = ctx, {}

    def function(self, ck: CompiledKernel):
        mod = self._modules.get(ck.cubin)
        if mod is None:
            mod = self._modules[ck.cubin] = self.ctx.load_module(ck.cubin)
        fn = self.ctx.function(mod, ck.kernel.name)
        if ck.dynamic_shared:
            self.ctx.allow_dynamic_shared(fn, ck.dynamic_shared)
        return fn


def bind(compiled: CompiledLowering, modules: ModuleCache, operand_ptrs: dict[int, int],
         scratch_ptrs: dict[str, int], overlap: bool = False) -> list[Launch]:
    """Launches with every buffer parameter resolved: operands by index (OUT for the
    output), scratch buffers by name; `overlap`: programmatic dependent launches."""
    launches = []
    for ck in compiled.kernels:
        ptrs = []
        for b in ck.kernel.buffers:
            ptrs.append(scratch_ptrs[b.name] if b.operand is None else operand_ptrs[b.operand])
        launches.append(Launch(modules.function(ck), ck.kernel.grid, ck.kernel.workgroup, ptrs,
                               ck.kernel.name, ck.dynamic_shared, overlap))
    return launches


__all__ = ["OUT", "CompiledKernel", "CompiledLowering", "ModuleCache", "bind",
           "compile_lowering"]
