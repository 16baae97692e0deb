"""Run printed kernels on host arrays: one arena, one recorded step, read back.

This is the path tests and one-off launches take; a plan keeps its arena and
recorded step instead and replays them.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
from poot.codegen.program import OUT, SCRATCH, Buffer, Kernel, Lowering
from poot.errors import BindError

from poot_wgpu.device import WgpuDevice
from poot_wgpu.kernel import Dispatch, KernelCache
from poot_wgpu.memory import Arena
from poot_wgpu.step import RecordedStep
from poot_wgpu.wgsl import print_kernel


def run_kernels(dev: WgpuDevice, kernels: Sequence[Kernel], arrays: Mapping[str, np.ndarray],
                cache: KernelCache | None = None) -> dict[str, np.ndarray]:
    """Dispatch `kernels` in order over buffers named like their parameters; `arrays`
    gives every buffer's initial contents (1-D, its dtype and count). Returns every
    buffer's final contents."""
    cache = cache or KernelCache(dev)
    specs = {}
    for k in kernels:
        for b in k.buffers:
            specs.setdefault(b.name, b)
    for name, b in specs.items():
        a = arrays.get(name)
        if a is None or a.dtype != b.dtype.numpy or a.size != b.count:
            raise BindError(f"buffer {name!r} wants {b.count} x {b.dtype}, got "
                            f"{None if a is None else (a.shape, a.dtype)}")
    arena = Arena(dev, {name: b.nbytes for name, b in specs.items()})
    for name in specs:
        arena.write(name, arrays[name])
    dispatches = []
    for k in kernels:
        printed = print_kernel(k, dev)
        kernel = cache.get(printed.source, len(printed.buffers), label=k.name)
        group = kernel.bind(arena, [b.name for b in printed.buffers])
        dispatches.append(Dispatch(kernel, group, printed.groups))
    RecordedStep(dev, dispatches, label="launch").submit()
    return {name: arena.read(name, b.dtype.numpy, (b.count,)) for name, b in specs.items()}


def run_lowering(dev: WgpuDevice, lowering: Lowering, operands: Sequence[np.ndarray | None],
                 out: np.ndarray, cache: KernelCache | None = None) -> np.ndarray:
    """Run one eqn's kernels: tensor operand i in its own region (None for literals), the
    output in another (or in operand `lowering.alias`'s, updated in place), scratch zeroed.
    A buffer may view its tensor's bytes as another dtype (u32 words). Returns the output."""
    cache = cache or KernelCache(dev)
    regions: dict[str, np.ndarray] = {}
    for i, a in enumerate(operands):
        if a is not None:
            regions[f"op{i}"] = np.ascontiguousarray(a)
    out_region = f"op{lowering.alias}" if lowering.alias is not None else "out"
    if lowering.alias is None:
        regions["out"] = np.ascontiguousarray(out)
    for s in lowering.scratch:
        regions[f"scratch:{s.name}"] = np.zeros(s.nbytes, np.uint8)

    def region_of(b: Buffer) -> str:
        if b.operand is SCRATCH:
            return f"scratch:{b.name}"
        return out_region if b.operand == OUT else f"op{b.operand}"

    arena = Arena(dev, {name: a.nbytes for name, a in regions.items()})
    for name, a in regions.items():
        arena.write(name, a)
    dispatches = []
    for k in lowering.kernels:
        printed = print_kernel(k, dev)
        kernel = cache.get(printed.source, len(printed.buffers), label=k.name)
        group = kernel.bind(arena, [region_of(b) for b in printed.buffers])
        dispatches.append(Dispatch(kernel, group, printed.groups))
    if dispatches:
        RecordedStep(dev, dispatches, label="lowering").submit()
    return arena.read(out_region, out.dtype, out.shape)
