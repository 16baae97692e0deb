"""Run printed kernels on host arrays: one arena, one recorded step, read back.

This is the path tests and one-off launches take; a plan keeps its arena and
recorded step instead and replays them.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
from poot.codegen.program import Kernel
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
