"""Run kernels on host arrays without a plan: fresh buffers, one submit, read back.

Tests and one-off launches take this path; a plan keeps its buffers and its
recorded step instead (poot_wgpu.runtime) and replays them.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
from poot.codegen.program import OUT, SCRATCH, BufferParam, Kernel, KernelProgram, check_arrays

from poot_wgpu import memory
from poot_wgpu.device import WgpuDevice
from poot_wgpu.kernel import KernelCache, dispatches_for
from poot_wgpu.step import RecordedStep
from poot_wgpu.wgsl import print_kernel


def _launch(dev: WgpuDevice, kernels: Sequence[Kernel], arrays: Mapping[str, np.ndarray],
            region_of, cache: KernelCache | None) -> dict[str, memory.WgpuBuffer]:
    """Upload `arrays` (one buffer each), dispatch `kernels` binding each kernel buffer to
    `arrays[region_of(buffer)]`, wait. Returns the device buffers by name."""
    bufs = {}
    for name, a in arrays.items():
        bufs[name] = memory.WgpuBuffer(dev, a.nbytes, name)
        memory.write(dev, bufs[name], 0, a)

    def resolve(b: BufferParam) -> dict:
        return memory.storage_binding(dev, bufs[region_of(b)], 0, b.nbytes, b.name)

    printed = [print_kernel(k, dev) for k in kernels]
    dispatches = dispatches_for(cache or KernelCache(dev), printed, resolve)
    RecordedStep(dev, dispatches, label="launch").submit()
    return bufs


def run_kernels(dev: WgpuDevice, kernels: Sequence[Kernel], arrays: Mapping[str, np.ndarray],
                cache: KernelCache | None = None) -> dict[str, np.ndarray]:
    """Dispatch `kernels` in order over buffers named like their parameters; `arrays`
    gives every buffer's initial contents (1-D, its dtype and count). Returns every
    buffer's final contents."""
    check_arrays(kernels, arrays)
    bufs = _launch(dev, kernels, arrays, lambda b: b.name, cache)
    return {name: memory.read(dev, bufs[name], 0, a.nbytes).view(a.dtype)
            for name, a in arrays.items()}


def run_lowering(dev: WgpuDevice, lowering: KernelProgram, operands: Sequence[np.ndarray | None],
                 out: np.ndarray, cache: KernelCache | None = None) -> np.ndarray:
    """Run one eqn's kernels: tensor operand i in its own buffer (None for literals), the
    output in another (or in operand `lowering.alias`'s, updated in place), scratch zeroed.
    A kernel buffer may view its tensor's bytes as another dtype (u32 words)."""
    arrays = {f"op{i}": np.ascontiguousarray(a) for i, a in enumerate(operands)
              if a is not None}
    out_name = f"op{lowering.alias}" if lowering.alias is not None else "out"
    if lowering.alias is None:
        arrays["out"] = np.ascontiguousarray(out)
    arrays.update({f"scratch:{s.name}": np.zeros(s.nbytes, np.uint8) for s in lowering.scratch})

    def region_of(b: BufferParam) -> str:
        if b.operand is SCRATCH:
            return f"scratch:{b.name}"
        return out_name if b.operand == OUT else f"op{b.operand}"

    bufs = _launch(dev, lowering.kernels, arrays, region_of, cache)
    raw = memory.read(dev, bufs[out_name], 0, out.nbytes)
    return raw.view(out.dtype).reshape(out.shape)
