"""Compute pipelines: one per SPIR-V module, specialization and binding count, cached
per device; shader modules one per SPIR-V module.

Every binding is a storage buffer in set 0, in the kernel's buffer order. A kernel's
sizes are specialization constants (poot_vulkan.specialize): kernels of one kind share a
shader module, and each pipeline specializes it. A kernel with subgroup reductions asks
for the subgroup size it was printed for where the device allows
(poot_vulkan.glsl.required_subgroup). Kernel programs carry no per-dispatch
scalars (positions come from slot buffers), so the layouts declare no push constants.
"""
from __future__ import annotations

import hashlib

from poot.errors import LoweringError

from poot_vulkan.context import VulkanDevice
from poot_vulkan.device import BACKEND
from poot_vulkan.specialize import Shader

#: VK_PIPELINE_SHADER_STAGE_CREATE_REQUIRE_FULL_SUBGROUPS_BIT (the binding lacks the name)
REQUIRE_FULL_SUBGROUPS = 0x2


class Pipeline:
    def __init__(self, dev: VulkanDevice, module, shader: Shader, n_bindings: int, name: str):
        vk = dev.vk
        self.dev, self.name, self.n_bindings = dev, name, n_bindings
        self.module, self.constants = module, shader.constants
        self.subgroup = shader.subgroup  # the size it requires (0: the driver's choice)
        constants = shader.constants
        self.set_layout = set_layout(dev, n_bindings)
        layouts = [self.set_layout]
        info = vk.VkPipelineLayoutCreateInfo(setLayoutCount=1, pSetLayouts=layouts)
        self.layout = vk.vkCreatePipelineLayout(dev.device, info, None)
        # every struct below is kept in a variable until the create call returns
        entries = [vk.VkSpecializationMapEntry(constantID=i, offset=4 * i, size=4)
                   for i in range(len(constants))]
        data = vk.ffi.new("int32_t[]", list(constants)) if constants else None
        special = vk.VkSpecializationInfo(mapEntryCount=len(entries),
                                          pMapEntries=entries or None,
                                          dataSize=4 * len(constants), pData=data)
        required = vk.VkPipelineShaderStageRequiredSubgroupSizeCreateInfo(
            requiredSubgroupSize=shader.subgroup) if shader.subgroup else None
        try:
            stage = vk.VkPipelineShaderStageCreateInfo(
                stage=vk.VK_SHADER_STAGE_COMPUTE_BIT, module=module, pName="main",
                pNext=required, flags=REQUIRE_FULL_SUBGROUPS if shader.full_subgroups else 0,
                pSpecializationInfo=special if constants else None)
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
    """Shader modules by SPIR-V digest, and pipelines by (SPIR-V digest, specialization,
    subgroup, binding count), for one device."""

    def __init__(self, dev: VulkanDevice):
        self.dev = dev
        self.modules: dict[str, object] = {}
        self._pipelines: dict[tuple, Pipeline] = {}

    def get(self, shader: Shader, n_bindings: int, name: str) -> Pipeline:
        digest = hashlib.sha256(shader.spirv).hexdigest()
        key = (digest, shader.constants, shader.subgroup, shader.full_subgroups, n_bindings)
        if key not in self._pipelines:
            self._pipelines[key] = Pipeline(self.dev, self._module(digest, shader.spirv, name),
                                            shader, n_bindings, name)
        return self._pipelines[key]

    def _module(self, digest: str, spirv: bytes, name: str):
        if digest not in self.modules:
            vk = self.dev.vk
            info = vk.VkShaderModuleCreateInfo(codeSize=len(spirv), pCode=spirv)
            try:
                self.modules[digest] = vk.vkCreateShaderModule(self.dev.device, info, None)
            except vk.VkError as e:
                raise LoweringError(f"the Vulkan driver refused kernel {name!r}'s module "
                                    f"({type(e).__name__})", op=name, backend=BACKEND,
                                    device=self.dev.name) from e
        return self.modules[digest]

    def __len__(self) -> int:
        return len(self._pipelines)


def pipelines(dev: VulkanDevice) -> PipelineCache:
    """The device's pipeline cache (shared by every runtime of the process)."""
    cache = dev.__dict__.get("_pipelines")
    if cache is None:
        cache = dev.__dict__["_pipelines"] = PipelineCache(dev)
    return cache
