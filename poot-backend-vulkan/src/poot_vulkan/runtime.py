"""The poot.runtime Runtime of the Vulkan backend: buffers, plan loading, recorded steps.

`load` compiles (or reuses) every planned kernel's pipeline, binds each kernel buffer
to its place (region buffer, byte offset, size) in a descriptor set, moves an output
whose place would cost a write-after-read barrier into a shadow buffer
(poot_vulkan.rename), gives every slot region a host-visible staging twin, and records
the whole step once (poot_vulkan.step).
`Executable.run()` resubmits that command buffer and waits for it.

A slot written by the host lands in its staging twin; the recorded step starts by
copying the twins into the slot buffers. Until the next run the twin holds the newest
bytes, so a read in between returns them. The other way, the step ends by copying each
plan output into a host-visible twin, so reading a step's result is a memcpy, not one
more submit; a write to the output's buffer, or another step, makes the device copy
the one read again. Where device memory is mapped (host-visible and coherent: lavapipe,
unified memory) neither copy is recorded: the host writes slots and reads outputs in
place, between steps, and the step saves the batch before its first dispatch and the
one after its last.
"""
from __future__ import annotations

from collections.abc import Mapping

import numpy as np
from poot.codegen.program import OUT, SCRATCH, BufferParam
from poot.contract import Device
from poot.errors import BindError, UnsupportedOp

from poot_vulkan.context import VulkanDevice
from poot_vulkan.device import BACKEND
from poot_vulkan.memory import Transfers, VulkanBuffer, check_binding
from poot_vulkan.pipeline import pipelines
from poot_vulkan.rename import rename_war
from poot_vulkan.step import Binding, Copy, Dispatch, RecordedStep


class VulkanExecutable:
    """A plan bound to its buffers; `run()` is one step (one submit of the recording)."""

    def __init__(self, runtime: VulkanRuntime, step: RecordedStep, slots: list[VulkanBuffer],
                 readbacks: dict):
        self.runtime, self.step, self.slots = runtime, step, slots
        self.readbacks = readbacks  # (buffer, offset, nbytes) -> host-visible twin
        self.recorded = True  # recorded at load; every run replays the command buffer

    @property
    def dispatches(self) -> int:
        return sum(isinstance(op, Dispatch) for op in self.step.ops)

    def run(self) -> None:
        self.runtime.fresh = {}
        self.step.submit()
        for s in self.slots:
            s.dirty = False
        self.runtime.fresh = self.readbacks


class VulkanRuntime:
    def __init__(self, device: Device, dev: VulkanDevice):
        self.device, self.dev = device, dev
        self.transfers = Transfers(dev)
        self.pipelines = pipelines(dev)
        self._scratch: list[VulkanBuffer] = []
        #: outputs the last step copied to the host: (buffer, offset, nbytes) -> twin
        self.fresh: dict = {}

    # -- memory -------------------------------------------------------------------------
    def alloc(self, nbytes: int, label: str) -> VulkanBuffer:
        return VulkanBuffer(self.dev, nbytes, label)

    def write(self, buf: VulkanBuffer, offset: int, array: np.ndarray) -> None:
        if self.fresh:
            self.fresh = {k: v for k, v in self.fresh.items() if k[0] is not buf}
        twin = getattr(buf, "twin", None)
        if twin is not None and buf.mapped is None:
            raw = np.ascontiguousarray(array).reshape(-1).view(np.uint8)
            twin.mapped[offset:offset + raw.size] = raw
            twin.flush()
            buf.dirty = True
            return
        self.transfers.write(buf, offset, array)
        if twin is not None:  # a mapped slot: keep the twin equal to it
            self.transfers.write(twin, offset, array)

    def read(self, buf: VulkanBuffer, offset: int, nbytes: int) -> np.ndarray:
        copied = self.fresh.get((buf, offset, nbytes))
        if copied is not None:
            return self.transfers.read(copied, 0, nbytes)
        if getattr(buf, "dirty", False):
            return self.transfers.read(buf.twin, offset, nbytes)
        return self.transfers.read(buf, offset, nbytes)

    def _twin(self, buf: VulkanBuffer) -> VulkanBuffer:
        if getattr(buf, "twin", None) is None:
            twin = VulkanBuffer(self.dev, buf.size, f"staging:{buf.label}", host=True)
            twin.mapped[:buf.size] = self.transfers.read(buf, 0, buf.size)
            twin.flush()
            buf.twin, buf.dirty = twin, False
        return buf.twin

    # -- plans ----------------------------------------------------------------------------
    def load(self, plan, buffers: Mapping[str, VulkanBuffer]) -> VulkanExecutable:
        missing = set(plan.regions) - set(buffers)
        if missing:
            raise BindError(f"no buffer bound to plan regions {sorted(missing)}")
        ops: list = []
        for step in plan.steps:
            compiled = step.lowering.program
            program = compiled.program
            if program.alias is not None and not step.inplace:
                # the kernels write only what changes: the output starts as a copy
                src, dst = step.inputs[program.alias], step.out
                ops.append(Copy(buffers[src.region], src.offset, buffers[dst.region],
                                dst.offset, src.nbytes))
            scratch = {}
            for b in program.scratch:
                scratch[b.name] = self.alloc(b.nbytes, f"scratch:{step.index}:{b.name}")
                self._scratch.append(scratch[b.name])
            fresh = program.alias is None and not step.inplace
            for k in compiled.kernels:
                pipeline = self.pipelines.get(k.binary, len(k.buffers), k.name)
                binds = tuple(self._binding(step, b, buffers, scratch) for b in k.buffers)
                out = next((i for i, b in enumerate(k.buffers)
                            if fresh and b.operand == OUT and b.access.writable), None)
                ops.append(Dispatch(pipeline, binds, k.groups, out,
                                    len(compiled.kernels) == 1))
        for c in plan.copies:
            ops.append(Copy(buffers[c.src.region], c.src.offset, buffers[c.dst.region],
                            c.dst.offset, c.src.nbytes))
        readbacks = {}
        for _, place in plan.outputs:
            buf = buffers[place.region]
            # an output in mapped device memory is read in place: a copy would add a batch
            if place.strides is None and place.nbytes and buf.mapped is None:
                twin = VulkanBuffer(self.dev, place.nbytes, f"readback:{place}", host=True)
                self._scratch.append(twin)
                ops.append(Copy(buf, place.offset, twin, 0, place.nbytes))
                readbacks[(buf, place.offset, place.nbytes)] = twin
        ops = rename_war(ops, self._shadow)
        slots = [buffers[r.name] for r in plan.slot_regions()]
        # a slot in mapped device memory is written in place before the submit (which
        # makes host writes visible): no upload, and no batch waiting for one
        uploads = [Copy(self._twin(s), 0, s, 0, s.size) for s in slots if s.mapped is None]
        return VulkanExecutable(self, RecordedStep(self.dev, ops, uploads), slots, readbacks)

    def _shadow(self, nbytes: int) -> VulkanBuffer:
        buf = self.alloc(nbytes, "shadow")
        self._scratch.append(buf)
        return buf

    def _binding(self, step, b: BufferParam, buffers, scratch) -> Binding:
        if b.operand is SCRATCH:
            buf = scratch[b.name]
            return Binding(buf, 0, max(b.nbytes, 1), b.access.writable)
        place = step.out if b.operand == OUT else step.inputs[b.operand]
        if place.strides is not None:
            raise UnsupportedOp(f"step {step.index} ({step.eqn.op.name}): Vulkan kernels "
                                f"read contiguous operands, got a strided view",
                                op=step.eqn.op.name, backend=BACKEND, device=self.dev.name)
        buf = buffers[place.region]
        size = max(b.nbytes, 1)
        check_binding(self.dev, buf, place.offset, size, f"step {step.index} {b.name}")
        return Binding(buf, place.offset, size, b.access.writable)

