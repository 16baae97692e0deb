"""A step recorded once into a command buffer and resubmitted every run.

The command buffer holds, in order: a barrier that makes host writes and the previous
submit's results visible; the slot uploads (each slot's host-visible staging buffer
copied into its device buffer, so a slot rewrite costs a memcpy and no extra submit);
every dispatch and buffer copy of the plan, each bound to its descriptor set (built once
here); and a barrier that makes the results visible to the host and to transfers.

Barriers between operations are placed by hazard: an operation that reads or writes a
byte range an earlier operation since the last barrier wrote, or writes a range one of
them read, gets a compute/transfer memory barrier first; independent dispatches run
without one, so the driver may overlap them. `submit()` is one vkQueueSubmit through
prebuilt cffi structs and one fence wait.
"""
from __future__ import annotations

from dataclasses import dataclass

from poot_vulkan.context import FENCE_TIMEOUT_NS, VulkanDevice
from poot_vulkan.memory import VulkanBuffer, copy, full_barrier, to_host_barrier
from poot_vulkan.pipeline import Pipeline


@dataclass(frozen=True)
class Binding:
    buffer: VulkanBuffer
    offset: int
    size: int
    writable: bool


@dataclass(frozen=True)
class Dispatch:
    pipeline: Pipeline
    bindings: tuple[Binding, ...]
    groups: tuple[int, int, int]

    def accesses(self):
        return [(b.buffer, b.offset, b.offset + b.size, b.writable) for b in self.bindings]


@dataclass(frozen=True)
class Copy:
    src: VulkanBuffer
    src_offset: int
    dst: VulkanBuffer
    dst_offset: int
    size: int

    def accesses(self):
        return [(self.src, self.src_offset, self.src_offset + self.size, False),
                (self.dst, self.dst_offset, self.dst_offset + self.size, True)]


class Hazards:
    """Byte ranges touched since the last barrier; says when the next op needs one."""

    def __init__(self):
        self.pending: list[tuple[int, int, int, bool]] = []
        self.barriers = 0

    def needs_barrier(self, accesses) -> bool:
        for buf, start, end, write in accesses:
            for pbuf, pstart, pend, pwrite in self.pending:
                if pbuf == id(buf) and start < pend and pstart < end and (write or pwrite):
                    return True
        return False

    def add(self, accesses) -> None:
        self.pending += [(id(buf), s, e, w) for buf, s, e, w in accesses]

    def reset(self) -> None:
        self.pending = []
        self.barriers += 1


class RecordedStep:
    def __init__(self, dev: VulkanDevice, ops: list, uploads: list[Copy] = (),
                 label: str = "poot-step"):
        vk = self.vk = dev.vk
        self.dev, self.label, self.ops, self.uploads = dev, label, list(ops), list(uploads)
        dispatches = [op for op in self.ops if isinstance(op, Dispatch)]
        self.pool, self.sets = None, []
        if dispatches:
            self._descriptor_sets(dispatches)
        self.command = dev.command_buffer()
        self.hazards = Hazards()
        self._record()
        self._commands = vk.ffi.new("VkCommandBuffer[1]", [self.command])
        self._submit = vk.ffi.new("VkSubmitInfo*", {
            "sType": vk.VK_STRUCTURE_TYPE_SUBMIT_INFO, "commandBufferCount": 1,
            "pCommandBuffers": self._commands})
        self._fences = vk.ffi.new("VkFence[1]", [dev.fence])
        self.replays = 0

    @property
    def barriers(self) -> int:
        return self.hazards.barriers

    def _descriptor_sets(self, dispatches: list[Dispatch]) -> None:
        vk, dev = self.vk, self.dev
        total = sum(len(d.bindings) for d in dispatches)
        sizes = [vk.VkDescriptorPoolSize(type=vk.VK_DESCRIPTOR_TYPE_STORAGE_BUFFER,
                                         descriptorCount=max(total, 1))]
        info = vk.VkDescriptorPoolCreateInfo(maxSets=len(dispatches), poolSizeCount=1,
                                             pPoolSizes=sizes)
        self.pool = vk.vkCreateDescriptorPool(dev.device, info, None)
        layouts = [d.pipeline.set_layout for d in dispatches]
        alloc = vk.VkDescriptorSetAllocateInfo(descriptorPool=self.pool,
                                               descriptorSetCount=len(layouts),
                                               pSetLayouts=layouts)
        handles = vk.vkAllocateDescriptorSets(dev.device, alloc)
        self.sets = [handles[i] for i in range(len(layouts))]
        infos, writes = [], []
        for d, ds in zip(dispatches, self.sets, strict=True):
            for i, b in enumerate(d.bindings):
                info = vk.VkDescriptorBufferInfo(buffer=b.buffer.handle, offset=b.offset,
                                                 range=b.size)
                infos.append(info)  # kept alive until the update below returns
                writes.append(vk.VkWriteDescriptorSet(
                    dstSet=ds, dstBinding=i, descriptorCount=1,
                    descriptorType=vk.VK_DESCRIPTOR_TYPE_STORAGE_BUFFER,
                    pBufferInfo=[info]))
        for start in range(0, len(writes), 4096):
            chunk = writes[start:start + 4096]
            vk.vkUpdateDescriptorSets(dev.device, len(chunk), chunk, 0, None)
        self._set_of = {id(d): ds for d, ds in zip(dispatches, self.sets, strict=True)}

    def _record(self) -> None:
        vk, cmd = self.vk, self.command
        vk.vkBeginCommandBuffer(cmd, vk.VkCommandBufferBeginInfo())
        full_barrier(vk, cmd)
        for u in self.uploads:
            copy(vk, cmd, u.src.handle, u.src_offset, u.dst.handle, u.dst_offset, u.size)
            self.hazards.add(u.accesses())
        bound = None
        for op in self.ops:
            accesses = op.accesses()
            if self.hazards.needs_barrier(accesses):
                full_barrier(vk, cmd)
                self.hazards.reset()
            self.hazards.add(accesses)
            if isinstance(op, Copy):
                copy(vk, cmd, op.src.handle, op.src_offset, op.dst.handle, op.dst_offset,
                     op.size)
                continue
            if op.pipeline is not bound:
                vk.vkCmdBindPipeline(cmd, vk.VK_PIPELINE_BIND_POINT_COMPUTE,
                                     op.pipeline.handle)
                bound = op.pipeline
            sets = [self._set_of[id(op)]]
            vk.vkCmdBindDescriptorSets(cmd, vk.VK_PIPELINE_BIND_POINT_COMPUTE,
                                       op.pipeline.layout, 0, 1, sets, 0, None)
            vk.vkCmdDispatch(cmd, *op.groups)
        to_host_barrier(vk, cmd)
        vk.vkEndCommandBuffer(cmd)

    def submit(self) -> None:
        """Run the recording once and wait for it."""
        vk, dev = self.vk, self.dev
        result = vk.lib.vkQueueSubmit(dev.queue, 1, self._submit, dev.fence)
        if result != vk.VK_SUCCESS:
            raise vk.exception_codes[result]
        result = vk.lib.vkWaitForFences(dev.device, 1, self._fences, vk.VK_TRUE,
                                        FENCE_TIMEOUT_NS)
        vk.lib.vkResetFences(dev.device, 1, self._fences)
        if result != vk.VK_SUCCESS:
            raise vk.exception_codes[result]
        self.replays += 1

    def __del__(self):
        try:
            self.destroy()
        except Exception:  # noqa: BLE001 - interpreter shutdown: the binding may be gone
            pass

    def destroy(self) -> None:
        vk, dev = self.vk, self.dev
        if self.command is not None:
            vk.vkFreeCommandBuffers(dev.device, dev.command_pool, 1, [self.command])
            self.command = None
        if self.pool is not None:
            vk.vkDestroyDescriptorPool(dev.device, self.pool, None)
            self.pool = None
