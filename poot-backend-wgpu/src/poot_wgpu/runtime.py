"""The poot.runtime Runtime of the wgpu backend: buffers, plan loading, recorded steps.

`load` turns every planned step into dispatches once (pipelines from the kernel cache,
bind groups over the plan's buffers at the planned offsets, scratch buffers; an output
that would make wgpu order independent dispatches moves to a bank: poot_wgpu.banks); each
`Executable.run()` replays that list as one submit (see poot_wgpu.step). The queue runs
submits, writes and reads in order, and a read waits for the queue, so a `read` after
`run()` sees the step. (wgpu-py 0.32's `on_submitted_work_done_sync` does not work,
so `run()` itself does not block; a timing must end with a read.)
"""
from __future__ import annotations

from collections.abc import Mapping

import numpy as np
from poot.codegen.lower import lower
from poot.codegen.program import OUT, SCRATCH, BufferParam
from poot.contract import Device
from poot.errors import BindError, UnsupportedOp
from poot.ir.ops import Broadcast
from poot.runtime.renaming import Access

from poot_wgpu import memory
from poot_wgpu.device import WgpuDevice
from poot_wgpu.banks import Pending, bank_outputs
from poot_wgpu.kernel import KernelCache, bind
from poot_wgpu.memory import BACKEND, WgpuBuffer
from poot_wgpu.step import BufferCopy, RecordedStep
from poot_wgpu.wgsl import print_kernel


class WgpuExecutable:
    """A plan bound to its buffers; `run()` is one step (one submit)."""

    def __init__(self, step: RecordedStep):
        self.step = step
        self.recorded = False

    @property
    def dispatches(self) -> int:
        return len(self.step.dispatches)

    def run(self) -> None:
        self.step.submit()
        self.recorded = True  # the dispatch list is the recording; every run replays it


class WgpuRuntime:
    def __init__(self, device: Device, dev: WgpuDevice):
        self.device, self.dev = device, dev
        self.kernels = KernelCache(dev)

    # -- memory -------------------------------------------------------------------------
    def alloc(self, nbytes: int, label: str) -> WgpuBuffer:
        return WgpuBuffer(self.dev, nbytes, label)

    def write(self, buf: WgpuBuffer, offset: int, array: np.ndarray) -> None:
        memory.write(self.dev, buf, offset, array)

    def read(self, buf: WgpuBuffer, offset: int, nbytes: int) -> np.ndarray:
        return memory.read(self.dev, buf, offset, nbytes)

    # -- plans ----------------------------------------------------------------------------
    def load(self, plan, buffers: Mapping[str, WgpuBuffer]) -> WgpuExecutable:
        missing = set(plan.regions) - set(buffers)
        if missing:
            raise BindError(f"no buffer bound to plan regions {sorted(missing)}")
        ops: list[Pending] = []
        for step in plan.steps:
            compiled = step.lowering.program
            program, printed = compiled.program, compiled.kernels
            if program.alias is not None and not step.inplace:
                # the kernels write only what changes: start the output as a copy
                src = step.inputs[program.alias]
                ops += _pending(self._copy_kernel(src.type),
                                self._resolver(step, (src,), buffers, {}), fresh=False)
            scratch = {b.name: self.alloc(b.nbytes, f"scratch:{step.index}:{b.name}")
                       for b in program.scratch}
            ops += _pending(printed, self._resolver(step, step.inputs, buffers, scratch),
                            fresh=program.alias is None and not step.inplace)
        copies = [self._copy(c, buffers) for c in plan.copies]
        # read after the step: its outputs (by the host) and its copies' sources (a
        # strided view: the rest of its buffer)
        kept = [Access(buffers[p.region].gpu, p.offset, p.offset + p.nbytes
                       if p.strides is None else buffers[p.region].gpu.size, False)
                for p in [place for _, place in plan.outputs] + [c.src for c in plan.copies]]
        bank_outputs(ops, self.dev.limit("min-storage-buffer-offset-alignment"),
                     lambda nbytes: self.alloc(nbytes, "bank"), kept)
        dispatches = [bind(self.kernels, op.printed, op.resources, op.writes) for op in ops]
        return WgpuExecutable(RecordedStep(self.dev, dispatches, copies, label="poot-plan"))

    def _copy_kernel(self, t):
        """An element copy of a `t` tensor: the Broadcast lowering to its own shape."""
        copy = lower(Broadcast(t.shape), [t], t)
        return [print_kernel(k, self.dev) for k in copy.kernels]

    def _resolver(self, step, inputs, buffers, scratch):
        def resolve(b: BufferParam) -> dict:
            if b.operand is SCRATCH:
                return memory.storage_binding(self.dev, scratch[b.name], 0, b.nbytes, b.name)
            place = step.out if b.operand == OUT else inputs[b.operand]
            if place.strides is not None:
                raise UnsupportedOp(f"step {step.index} ({step.eqn.op.name}): wgpu kernels "
                                    f"read contiguous operands, got a strided view",
                                    op=step.eqn.op.name, backend=BACKEND,
                                    device=self.dev.name)
            what = f"step {step.index} {b.name}"
            return memory.storage_binding(self.dev, buffers[place.region], place.offset,
                                          b.nbytes, what)
        return resolve

    def _copy(self, c, buffers) -> BufferCopy:
        size = memory.align(c.src.nbytes)
        for place in (c.src, c.dst):
            if place.offset % memory.WORD:
                raise UnsupportedOp(f"copy of {place} is not word aligned", backend=BACKEND,
                                    device=self.dev.name)
        return BufferCopy(buffers[c.src.region].gpu, c.src.offset, buffers[c.dst.region].gpu,
                          c.dst.offset, size)


def _pending(printed, resolve, fresh: bool) -> list[Pending]:
    """The kernels of one step, unbound; where the step defines its output anew (`fresh`),
    each kernel's written OUT binding is marked as that definition."""
    out = []
    for p in printed:
        writes = tuple(b.access.writable for b in p.buffers)
        defines = next((i for i, b in enumerate(p.buffers)
                        if fresh and b.operand == OUT and b.access.writable), None)
        out.append(Pending(p, [resolve(b) for b in p.buffers], writes, defines,
                           len(printed) == 1))
    return out
