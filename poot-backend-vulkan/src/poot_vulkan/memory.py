"""Device buffers and host transfers.

A `VulkanBuffer` is one VkBuffer in its own allocation, created once at its full size
(a stable address for the life of every recorded step that binds it). Host writes and
reads go through a staging buffer of the device (one copy command per chunk, waited
on), or straight through the mapping where the buffer's memory is host-visible and
coherent. Every command buffer poot records starts with a full memory barrier (the
previous submit's writes become visible to this one) and ends with one to the host.
"""
from __future__ import annotations

import numpy as np
from poot.errors import BindError, LimitExceeded

from poot_vulkan.context import VulkanDevice
from poot_vulkan.device import BACKEND

ALIGN = 256          # Runtime.alloc's promise; also every storage offset alignment seen
STAGING_CHUNK = 64 << 20


def align(n: int, a: int = ALIGN) -> int:
    return (n + a - 1) // a * a


class VulkanBuffer:
    """A device buffer (the poot.runtime Buffer protocol): `nbytes`, `label`, `handle`."""

    def __init__(self, dev: VulkanDevice, nbytes: int, label: str, *, host: bool = False):
        vk = dev.vk
        self.dev, self.nbytes, self.label = dev, int(nbytes), label
        self.size = max(align(nbytes, 16), 16)
        usage = (vk.VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | vk.VK_BUFFER_USAGE_TRANSFER_SRC_BIT
                 | vk.VK_BUFFER_USAGE_TRANSFER_DST_BIT)
        info = vk.VkBufferCreateInfo(size=self.size, usage=usage,
                                     sharingMode=vk.VK_SHARING_MODE_EXCLUSIVE)
        self.handle = vk.vkCreateBuffer(dev.device, info, None)
        req = vk.vkGetBufferMemoryRequirements(dev.device, self.handle)
        memory_type = dev.staging_type if host else dev.device_type
        if not req.memoryTypeBits & (1 << memory_type):
            raise BindError(f"buffer {label!r}: memory type {memory_type} not allowed "
                            f"(mask {req.memoryTypeBits:#x})")
        self.memory = dev.allocate(int(req.size), memory_type, label)
        vk.vkBindBufferMemory(dev.device, self.handle, self.memory, 0)
        flags = dev.memory_types[memory_type][0]
        self.coherent = bool(flags & vk.VK_MEMORY_PROPERTY_HOST_COHERENT_BIT)
        self.mapped = None
        if host or dev.direct:
            raw = vk.vkMapMemory(dev.device, self.memory, 0, self.size, 0)
            self.mapped = np.frombuffer(raw, np.uint8)

    def flush(self) -> None:
        """Make host writes through the mapping visible (non-coherent memory only)."""
        if not self.coherent:
            vk = self.dev.vk
            rng = vk.VkMappedMemoryRange(memory=self.memory, offset=0, size=self.size)
            vk.vkFlushMappedMemoryRanges(self.dev.device, 1, [rng])

    def invalidate(self) -> None:
        if not self.coherent:
            vk = self.dev.vk
            rng = vk.VkMappedMemoryRange(memory=self.memory, offset=0, size=self.size)
            vk.vkInvalidateMappedMemoryRanges(self.dev.device, 1, [rng])

    def destroy(self) -> None:
        """Free the buffer (the device is idle between steps: run() waits for it)."""
        vk = self.dev.vk
        if self.handle is not None:
            if self.mapped is not None:
                vk.vkUnmapMemory(self.dev.device, self.memory)
                self.mapped = None
            vk.vkDestroyBuffer(self.dev.device, self.handle, None)
            vk.vkFreeMemory(self.dev.device, self.memory, None)
            self.handle = None

    def __del__(self):
        # a conformance run makes thousands of buffers; drivers cap live allocations
        try:
            self.destroy()
        except Exception:  # noqa: BLE001 - interpreter shutdown: the binding may be gone
            pass

    def __repr__(self) -> str:
        return f"VulkanBuffer({self.label!r}, {self.nbytes} bytes)"


def full_barrier(vk, cmd, dst_access=None, dst_stage=None) -> None:
    """Every earlier write (shader or transfer) visible to every later read or write."""
    src = vk.VK_ACCESS_SHADER_WRITE_BIT | vk.VK_ACCESS_TRANSFER_WRITE_BIT | \
        vk.VK_ACCESS_HOST_WRITE_BIT
    dst = dst_access if dst_access is not None else (
        vk.VK_ACCESS_SHADER_READ_BIT | vk.VK_ACCESS_SHADER_WRITE_BIT
        | vk.VK_ACCESS_TRANSFER_READ_BIT | vk.VK_ACCESS_TRANSFER_WRITE_BIT)
    barrier = vk.VkMemoryBarrier(srcAccessMask=src, dstAccessMask=dst)
    stages = vk.VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | vk.VK_PIPELINE_STAGE_TRANSFER_BIT
    vk.vkCmdPipelineBarrier(cmd, stages | vk.VK_PIPELINE_STAGE_HOST_BIT,
                            dst_stage if dst_stage is not None else stages, 0,
                            1, [barrier], 0, None, 0, None)


def to_host_barrier(vk, cmd) -> None:
    full_barrier(vk, cmd, vk.VK_ACCESS_HOST_READ_BIT, vk.VK_PIPELINE_STAGE_HOST_BIT)


def copy(vk, cmd, src, src_offset: int, dst, dst_offset: int, size: int) -> None:
    region = vk.VkBufferCopy(srcOffset=src_offset, dstOffset=dst_offset, size=size)
    vk.vkCmdCopyBuffer(cmd, src, dst, 1, [region])


class Transfers:
    """Host <-> device copies of one device through a staging buffer it grows on demand."""

    def __init__(self, dev: VulkanDevice):
        self.dev = dev
        self.staging: VulkanBuffer | None = None

    def _stage(self, nbytes: int) -> VulkanBuffer:
        if self.staging is None or self.staging.size < nbytes:
            if self.staging is not None:
                self.staging.destroy()
            self.staging = VulkanBuffer(self.dev, max(nbytes, 1 << 20), "staging", host=True)
        return self.staging

    def write(self, buf: VulkanBuffer, offset: int, array: np.ndarray) -> None:
        raw = np.ascontiguousarray(array).reshape(-1).view(np.uint8)
        check_range(buf, offset, raw.size)
        if buf.mapped is not None:
            buf.mapped[offset:offset + raw.size] = raw
            buf.flush()
            return
        vk = self.dev.vk
        for start in range(0, raw.size, STAGING_CHUNK):
            part = raw[start:start + STAGING_CHUNK]
            stage = self._stage(min(raw.size, STAGING_CHUNK))
            stage.mapped[:part.size] = part
            stage.flush()

            def record(cmd, n=part.size, at=offset + start, stage=stage):
                full_barrier(vk, cmd)
                copy(vk, cmd, stage.handle, 0, buf.handle, at, n)
            self.dev.oneshot(record)

    def read(self, buf: VulkanBuffer, offset: int, nbytes: int) -> np.ndarray:
        check_range(buf, offset, nbytes)
        if buf.mapped is not None:
            buf.invalidate()
            return buf.mapped[offset:offset + nbytes].copy()
        vk = self.dev.vk
        out = np.empty(nbytes, np.uint8)
        for start in range(0, nbytes, STAGING_CHUNK):
            n = min(STAGING_CHUNK, nbytes - start)
            stage = self._stage(min(nbytes, STAGING_CHUNK))

            def record(cmd, n=n, at=offset + start, stage=stage):
                full_barrier(vk, cmd)
                copy(vk, cmd, buf.handle, at, stage.handle, 0, n)
                to_host_barrier(vk, cmd)
            self.dev.oneshot(record)
            stage.invalidate()
            out[start:start + n] = stage.mapped[:n]
        return out


def check_range(buf: VulkanBuffer, offset: int, nbytes: int) -> None:
    if offset < 0 or nbytes < 0 or offset + nbytes > buf.size:
        raise BindError(f"byte range [{offset}, {offset + nbytes}) is outside buffer "
                        f"{buf.label!r} ({buf.size} bytes)")


def check_binding(dev: VulkanDevice, buf: VulkanBuffer, offset: int, size: int,
                  what: str) -> None:
    """A storage binding of `size` bytes at `offset`, within the device's limits."""
    limit = dev.facts.limit("maxStorageBufferRange")
    if size > limit:
        raise LimitExceeded(f"tensor {what!r} is {size} bytes, over the device's "
                            f"maxStorageBufferRange {limit}; a kernel cannot bind it whole",
                            backend=BACKEND, device=dev.name)
    alignment = dev.facts.limit("minStorageBufferOffsetAlignment")
    if offset % alignment:
        raise LimitExceeded(f"tensor {what!r} starts at byte {offset}, not a multiple of the "
                            f"device's minStorageBufferOffsetAlignment {alignment}",
                            backend=BACKEND, device=dev.name)
    if offset + size > buf.size:
        raise BindError(f"tensor {what!r} ({size} bytes at {offset}) runs past the end of "
                        f"buffer {buf.label!r} ({buf.size} bytes)")
