"""A step recorded once into a command buffer and resubmitted every run.

The command buffer holds, in order: a barrier that makes host writes and the previous
submit's results visible; the slot uploads (each slot's host-visible staging buffer
copied into its device buffer, so a slot rewrite costs a memcpy and no extra submit);
every dispatch and buffer copy of the plan, each bound to its descriptor set (built once
here); and a barrier that makes the results visible to the host and to transfers.

Barriers between operations are placed by hazard: the operations are cut into batches,
a new batch starting where an operation reads or writes a byte range an operation of
the current batch wrote, or writes a range one of them read. Independent dispatches of
one batch run without a barrier, so the driver may overlap them. The barrier between two
batches names only the stages and accesses of those two, in the form poot_vulkan.barrier
chooses. `submit()` is one vkQueueSubmit through prebuilt cffi structs and one fence wait.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

from poot_vulkan.barrier import check_form, chosen_form, record_barrier
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
    #: the binding of the output its step defines anew (not in place, not an update of an
    #: aliased buffer), and whether it is the step's only dispatch (poot_vulkan.rename)
    out: int | None = None
    sole: bool = False

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


def batches(ops) -> list[list]:
    """`ops` cut where one touches what the current batch wrote, or writes what it read."""
    out: list[list] = []
    pending: list[tuple[int, int, int, bool]] = []
    for op in ops:
        accesses = [(id(buf), s, e, w) for buf, s, e, w in op.accesses()]
        clash = any(pb == b and s < pe and ps < e and (w or pw)
                    for b, s, e, w in accesses for pb, ps, pe, pw in pending)
        if clash or not out:
            out.append([])
            pending = []
        out[-1].append(op)
        pending += accesses
    return out


class RecordedStep:
    """`ops` (Dispatch and Copy) recorded once after `uploads`, with barriers of `barrier`
    form between batches (poot_vulkan.barrier.FORMS; POOT_VULKAN_BARRIER's when None)."""

    def __init__(self, dev: VulkanDevice, ops: list, uploads: list[Copy] = (),
                 label: str = "poot-step", barrier: str | None = None):
        vk = self.vk = dev.vk
        self.dev, self.label, self.ops, self.uploads = dev, label, list(ops), list(uploads)
        self.barrier = check_form(dev, barrier or chosen_form())
        dispatches = [op for op in self.ops if isinstance(op, Dispatch)]
        self.pool, self.sets = None, []
        if dispatches:
            self._descriptor_sets(dispatches)
        self.batches = batches(self.uploads + self.ops)
        self.command = dev.command_buffer()
        self.record(self.command)
        self._commands = vk.ffi.new("VkCommandBuffer[1]", [self.command])
        self._submit = vk.ffi.new("VkSubmitInfo*", {
            "sType": vk.VK_STRUCTURE_TYPE_SUBMIT_INFO, "commandBufferCount": 1,
            "pCommandBuffers": self._commands})
        self._fences = vk.ffi.new("VkFence[1]", [dev.fence])
        self.replays = 0

    @property
    def barriers(self) -> int:
        """Barriers recorded between operations (the first and the last not counted)."""
        return len(self.batches) - 1

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

    def record(self, cmd, stamp=None) -> None:
        """Record the step into `cmd`; `stamp(cmd)`, when given, is called after the
        uploads and after every operation (poot_vulkan.profile writes a timestamp)."""
        vk = self.vk
        vk.vkBeginCommandBuffer(cmd, vk.VkCommandBufferBeginInfo())
        if stamp is not None:
            stamp(cmd, start=True)
        full_barrier(vk, cmd)
        bound = None
        for i, batch in enumerate(self.batches):
            if i:
                record_barrier(self.dev, cmd, self.barrier, self.batches[i - 1], batch, Copy)
            for op in batch:
                if isinstance(op, Copy):
                    copy(vk, cmd, op.src.handle, op.src_offset, op.dst.handle, op.dst_offset,
                         op.size)
                else:
                    if op.pipeline is not bound:
                        vk.vkCmdBindPipeline(cmd, vk.VK_PIPELINE_BIND_POINT_COMPUTE,
                                             op.pipeline.handle)
                        bound = op.pipeline
                    sets = [self._set_of[id(op)]]
                    vk.vkCmdBindDescriptorSets(cmd, vk.VK_PIPELINE_BIND_POINT_COMPUTE,
                                               op.pipeline.layout, 0, 1, sets, 0, None)
                    vk.vkCmdDispatch(cmd, *op.groups)
                if stamp is not None:
                    stamp(cmd)
        to_host_barrier(vk, cmd)
        vk.vkEndCommandBuffer(cmd)

    def submit(self) -> None:
        """Run the recording once and wait for it (polling the fence where the device
        asks for it: `VulkanDevice.spin`)."""
        vk, dev = self.vk, self.dev
        lib = vk.lib
        result = lib.vkQueueSubmit(dev.queue, 1, self._submit, dev.fence)
        if result != vk.VK_SUCCESS:
            raise vk.exception_codes[result]
        if dev.spin:
            deadline = time.monotonic() + FENCE_TIMEOUT_NS / 1e9
            while (result := lib.vkGetFenceStatus(dev.device, dev.fence)) == vk.VK_NOT_READY:
                if time.monotonic() > deadline:
                    result = vk.VK_TIMEOUT
                    break
        else:
            result = lib.vkWaitForFences(dev.device, 1, self._fences, vk.VK_TRUE,
                                         FENCE_TIMEOUT_NS)
        lib.vkResetFences(dev.device, 1, self._fences)
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
