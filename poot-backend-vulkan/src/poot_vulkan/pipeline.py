"""Compute pipelines: one per SPIR-V module and binding count, cached per device.

Every binding is a storage buffer in set 0, in the kernel's buffer order. Kernel
programs carry no per-dispatch scalars (shapes are static and printed into the
source; positions come from slot buffers), so the pipeline layouts declare no push
constants and no specialization constants.
"""
from __future__ import annotations

import hashlib

from poot.errors import LoweringError

from poot_vulkan.context import VulkanDevice
from poot_vulkan.device import BACKEND


class Pipeline:
    def __init__(self, dev: VulkanDevice, spirv: bytes, n_bindings: int, name: str):
        vk = dev.vk
        self.dev, self.name, self.n_bindings = dev, name, n_bindings
        self.set_layout = set_layout(dev, n_bindings)
        layouts = [self.set_layout]
        info = vk.VkPipelineLayoutCreateInfo(setLayoutCount=1, pSetLayouts=layouts)
        self.layout = vk.vkCreatePipelineLayout(dev.device, info, None)
        module_info = vk.VkShaderModuleCreateInfo(codeSize=len(spirv), pCode=spirv)
        try:
            self.module = vk.vkCreateShaderModule(dev.device, module_info, None)
            stage = vk.VkPipelineShaderStageCreateInfo(
                stage=vk.VK_SHADER_STAGE_COMPUTE_BIT, module=self.module, pName="main")
            create = vk.VkComputePipelineCreateInfo(stage=stage, layout=self.layout)
            self.handle = vk.vkCreateComputePipelines(dev.device, vk.VK_NULL_HANDLE, 1,
                                                      [create], None)[0]
        except vk.VkError as e:
            raise LoweringError(f"the Vulkan driver refused kernel {name!r} "
                                f"({type(e).__name__})", op=name, backend=BACKEND,
                                device=dev.name) from e


def set_layout(dev: VulkanDevice, n: int):
    """The descriptor set layout of `n` storage buffers (one per count, per device)."""
    cache = dev.__dict__.setdefault("_set_layouts", {})
    if n not in cache:
        vk = dev.vk
        bindings = [vk.VkDescriptorSetLayoutBinding(
            binding=i, descriptorType=vk.VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, descriptorCount=1,
            stageFlags=vk.VK_SHADER_STAGE_COMPUTE_BIT) for i in range(n)]
        info = vk.VkDescriptorSetLayoutCreateInfo(bindingCount=n, pBindings=bindings or None)
        cache[n] = vk.vkCreateDescriptorSetLayout(dev.device, info, None)
    return cache[n]


class PipelineCache:
    """Pipelines by (SPIR-V digest, binding count) for one device."""

    def __init__(self, dev: VulkanDevice):
        self.dev = dev
        self._pipelines: dict[tuple[str, int], Pipeline] = {}

    def get(self, spirv: bytes, n_bindings: int, name: str) -> Pipeline:
        key = (hashlib.sha256(spirv).hexdigest(), n_bindings)
        if key not in self._pipelines:
            self._pipelines[key] = Pipeline(self.dev, spirv, n_bindings, name)
        return self._pipelines[key]

    def __len__(self) -> int:
        return len(self._pipelines)


def pipelines(dev: VulkanDevice) -> PipelineCache:
    """The device's pipeline cache (shared by every runtime of the process)."""
    cache = dev.__dict__.get("_pipelines")
    if cache is None:
        cache = dev.__dict__["_pipelines"] = PipelineCache(dev)
    return cache
