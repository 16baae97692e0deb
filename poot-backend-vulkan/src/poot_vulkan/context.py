"""A logical Vulkan device: its queue, command pool, memory types and one-shot submits.

Features are enabled exactly as the device reports them (16-bit and 8-bit storage,
float16/int8/int16 arithmetic, timeline semaphores, integer dot products, synchronization2);
the printer only uses what is on.
Memory: buffers live in the device-local type of the largest device-local heap; host
transfers go through host-visible staging memory (coherent where the device offers it,
else flushed and invalidated explicitly). Where the device-local type is itself
host-visible and coherent (lavapipe, a unified-memory GPU), buffers are mapped once and
the host copies into them directly.
"""
from __future__ import annotations

import os

from poot.errors import CapacityError, DeviceUnavailable

from poot_vulkan.device import (
    BACKEND,
    INTEGER_DOT_EXTENSION,
    SUBGROUP_SIZE_EXTENSION,
    SYNC2_EXTENSION,
    DeviceFacts,
)

FENCE_TIMEOUT_NS = 600 * 10 ** 9  # a step that runs ten minutes is a hung device
STAGING_VAR = "POOT_VULKAN_STAGING"


class VulkanDevice:
    def __init__(self, inst, physical, facts: DeviceFacts):
        vk = self.vk = inst.vk
        self.instance, self.physical, self.facts = inst, physical, facts
        families = vk.vkGetPhysicalDeviceQueueFamilyProperties(physical)
        compute = [i for i, q in enumerate(families) if q.queueFlags & vk.VK_QUEUE_COMPUTE_BIT]
        if not compute:
            raise DeviceUnavailable(f"Vulkan device {facts.name} has no compute queue")
        self.family = compute[0]
        self.timestamp_bits = int(families[self.family].timestampValidBits)

        has = facts.has
        v12 = vk.VkPhysicalDeviceVulkan12Features(
            shaderFloat16=has("shaderFloat16"), shaderInt8=has("shaderInt8"),
            storageBuffer8BitAccess=has("storageBuffer8BitAccess"),
            timelineSemaphore=has("timelineSemaphore"))
        v11 = vk.VkPhysicalDeviceVulkan11Features(
            pNext=v12, storageBuffer16BitAccess=has("storageBuffer16BitAccess"))
        base = vk.VkPhysicalDeviceFeatures(shaderInt16=has("shaderInt16"),
                                           shaderInt64=has("shaderInt64"))
        chain = v11
        extensions: list[str] = []
        if has("subgroupSizeControl"):
            chain = vk.VkPhysicalDeviceSubgroupSizeControlFeatures(
                pNext=v11, subgroupSizeControl=True,
                computeFullSubgroups=has("computeFullSubgroups"))
            extensions.append(SUBGROUP_SIZE_EXTENSION)
        if has("shaderIntegerDotProduct"):
            chain = vk.VkPhysicalDeviceShaderIntegerDotProductFeatures(
                pNext=chain, shaderIntegerDotProduct=True)
            extensions.append(INTEGER_DOT_EXTENSION)
        if has("synchronization2"):
            chain = vk.VkPhysicalDeviceSynchronization2Features(
                pNext=chain, synchronization2=True)
            extensions.append(SYNC2_EXTENSION)
        features2 = vk.VkPhysicalDeviceFeatures2(pNext=chain, features=base)
        priorities = [1.0]
        queue_info = vk.VkDeviceQueueCreateInfo(queueFamilyIndex=self.family, queueCount=1,
                                                pQueuePriorities=priorities)
        # no kernel uses cooperative matrices yet: the extension is reported, not enabled
        info = vk.VkDeviceCreateInfo(pNext=features2, queueCreateInfoCount=1,
                                     pQueueCreateInfos=[queue_info],
                                     enabledExtensionCount=len(extensions),
                                     ppEnabledExtensionNames=extensions or None,
                                     enabledLayerCount=len(inst.layers),
                                     ppEnabledLayerNames=inst.layers or None)
        try:
            self.device = vk.vkCreateDevice(physical, info, None)
        except Exception as e:
            raise DeviceUnavailable(f"Vulkan device {facts.name} refused a logical device "
                                    f"({type(e).__name__}: {e})") from e
        self.queue = vk.vkGetDeviceQueue(self.device, self.family, 0)
        #: vkCmdPipelineBarrier2KHR where synchronization2 is on, else None
        self.barrier2 = vk.vkGetDeviceProcAddr(self.device, "vkCmdPipelineBarrier2KHR") \
            if has("synchronization2") else None
        pool_info = vk.VkCommandPoolCreateInfo(
            queueFamilyIndex=self.family,
            flags=vk.VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT)
        self.command_pool = vk.vkCreateCommandPool(self.device, pool_info, None)
        self.fence = vk.vkCreateFence(self.device, vk.VkFenceCreateInfo(), None)
        self._pick_memory()
        self._oneshot = None
        #: a recorded step's submit polls its fence rather than sleeping on it (a GPU
        #: step is a millisecond or two, and a sleeping wait adds a wake-up to each); a
        #: software device needs the host's cores for the step itself, so it sleeps
        self.spin = not facts.is_software

    @property
    def name(self) -> str:
        return self.facts.name

    def __repr__(self) -> str:
        return f"VulkanDevice({self.facts.describe()})"

    # -- memory types ----------------------------------------------------------------------
    def _pick_memory(self) -> None:
        vk = self.vk
        props = vk.vkGetPhysicalDeviceMemoryProperties(self.physical)
        types = [(int(props.memoryTypes[i].propertyFlags), int(props.memoryTypes[i].heapIndex))
                 for i in range(props.memoryTypeCount)]
        heaps = [int(props.memoryHeaps[i].size) for i in range(props.memoryHeapCount)]
        self.memory_types = types
        local = vk.VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT
        visible = vk.VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT
        coherent = vk.VK_MEMORY_PROPERTY_HOST_COHERENT_BIT
        device_types = [i for i, (f, _) in enumerate(types) if f & local]
        if not device_types:
            device_types = list(range(len(types)))
        # the largest device-local heap; within it, the first type (drivers list the
        # plain device-local type before host-visible windows onto it)
        big = max(types[i][1] for i in device_types if heaps[types[i][1]] == max(
            heaps[types[j][1]] for j in device_types))
        self.device_type = next(i for i in device_types if types[i][1] == big)
        flags = types[self.device_type][0]
        # POOT_VULKAN_STAGING=1 takes the staging path a discrete GPU takes (for tests)
        self.direct = bool(flags & visible and flags & coherent) and \
            os.environ.get(STAGING_VAR, "") not in ("1", "true", "yes")
        # staging: host memory the CPU reads fast (cached) and that needs no flushes
        # (coherent), rather than a write-combined window onto device memory
        cached = vk.VK_MEMORY_PROPERTY_HOST_CACHED_BIT
        visible_types = [i for i, (f, _) in enumerate(types) if f & visible]
        if not visible_types:
            raise DeviceUnavailable(f"Vulkan device {self.name} has no host-visible memory")
        self.staging_type = min(visible_types, key=lambda i: (
            not types[i][0] & coherent, not types[i][0] & cached,
            bool(types[i][0] & local and not self.direct), i))

    def allocate(self, size: int, memory_type: int, label: str):
        vk = self.vk
        info = vk.VkMemoryAllocateInfo(allocationSize=size, memoryTypeIndex=memory_type)
        try:
            return vk.vkAllocateMemory(self.device, info, None)
        except (vk.VkErrorOutOfDeviceMemory, vk.VkErrorOutOfHostMemory,
                vk.VkErrorTooManyObjects) as e:
            raise CapacityError(f"Vulkan could not allocate {size} bytes for {label!r} on "
                                f"{self.name}: {type(e).__name__}") from e

    # -- submits -------------------------------------------------------------------------------
    def command_buffer(self):
        vk = self.vk
        info = vk.VkCommandBufferAllocateInfo(commandPool=self.command_pool,
                                              level=vk.VK_COMMAND_BUFFER_LEVEL_PRIMARY,
                                              commandBufferCount=1)
        return vk.vkAllocateCommandBuffers(self.device, info)[0]

    def submit_and_wait(self, command_buffer) -> None:
        """Submit one recorded command buffer and wait for the fence."""
        vk = self.vk
        buffers = [command_buffer]
        submit = vk.VkSubmitInfo(commandBufferCount=1, pCommandBuffers=buffers)
        vk.vkQueueSubmit(self.queue, 1, [submit], self.fence)
        self.wait()

    def wait(self) -> None:
        vk = self.vk
        try:
            vk.vkWaitForFences(self.device, 1, [self.fence], vk.VK_TRUE, FENCE_TIMEOUT_NS)
        finally:
            vk.vkResetFences(self.device, 1, [self.fence])

    def oneshot(self, record) -> None:
        """Record `record(cmd)` into the device's one-shot command buffer, run it, wait."""
        vk = self.vk
        if self._oneshot is None:
            self._oneshot = self.command_buffer()
        cmd = self._oneshot
        vk.vkResetCommandBuffer(cmd, 0)
        begin = vk.VkCommandBufferBeginInfo(
            flags=vk.VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT)
        vk.vkBeginCommandBuffer(cmd, begin)
        record(cmd)
        vk.vkEndCommandBuffer(cmd)
        self.submit_and_wait(cmd)


__all__ = ["VulkanDevice", "BACKEND"]
