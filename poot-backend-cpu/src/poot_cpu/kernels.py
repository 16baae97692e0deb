"""Kernels of CPU-shaped source builders, in the seam's vocabulary.

The shared sequence (poot.kernel_backend: check -> lower -> print -> compile -> wrap)
makes a `CompiledProgram` of printed kernel programs. For the few eqns whose shared
schedule is shaped for GPUs (packed contractions, attention) the cpu backend has source
builders (poot_cpu.gemv, poot_cpu.attention) that write the C function directly from
the eqn's shapes; `built_kernel` gives such a function the same form: a `Kernel` record
naming its buffer parameters (its body is the builder's source, not a program), so the
runtime binds every kernel of a plan the same way.

Nothing is compiled here: the runtime compiles every function of a plan in one
translation unit (poot_cpu.step), so a plan costs one compiler run.
"""
from __future__ import annotations

from poot.codegen.program import BufferParam, Kernel
from poot.kernel_backend import CompiledKernel


def built_kernel(name: str, source: str, buffers: tuple[BufferParam, ...]) -> CompiledKernel:
    """A builder's C function `name(buffers...)` as a compiled kernel of the seam."""
    return CompiledKernel(Kernel(name, buffers, (1,), (1,), ()), source)


__all__ = ["built_kernel"]
