"""Run kernel programs on host arrays without a plan: fresh buffers, one submit, read back.

Tests and one-off launches take this path; a plan keeps its buffers and its recorded
step instead (poot_vulkan.runtime) and replays it.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
from poot.codegen.program import Kernel, check_arrays

from poot_vulkan.compiler import compile_kernel
from poot_vulkan.context import VulkanDevice
from poot_vulkan.device import DeviceFacts
from poot_vulkan.glsl import GlslPrinter, dispatch_groups
from poot_vulkan.memory import Transfers, VulkanBuffer
from poot_vulkan.pipeline import pipelines
from poot_vulkan.step import Binding, Dispatch, RecordedStep


def run_kernels(dev: VulkanDevice, kernels: Sequence[Kernel], arrays: Mapping[str, np.ndarray],
                facts: DeviceFacts | None = None) -> tuple[dict[str, np.ndarray], RecordedStep]:
    """Dispatch `kernels` in order over buffers named like their parameters (`arrays` gives
    each one's initial contents); `facts` prints for a device with other limits. Returns
    every buffer's final contents and the recorded step."""
    check_arrays(kernels, arrays)
    transfers = Transfers(dev)
    bufs = {}
    for name, a in arrays.items():
        bufs[name] = VulkanBuffer(dev, a.nbytes, name)
        transfers.write(bufs[name], 0, a)
    ops = []
    facts = facts or dev.facts
    for k in kernels:
        shader = compile_kernel(k, GlslPrinter(facts).source(k), facts)
        pipeline = pipelines(dev).get(shader, len(k.buffers), k.name)
        ops.append(Dispatch(pipeline, tuple(Binding(bufs[b.name], 0, b.nbytes,
                                                    b.access.writable) for b in k.buffers),
                            dispatch_groups(k, facts)))
    step = RecordedStep(dev, ops, label="launch")
    step.submit()
    out = {name: transfers.read(bufs[name], 0, a.nbytes).view(a.dtype)
           for name, a in arrays.items()}
    step.destroy()
    for b in bufs.values():
        b.destroy()
    return out, step
