"""The `vulkan` Backend: probe, capability facts, the GLSL printer, glslang, the runtime.

Everything else (check -> lower -> print -> compile -> wrap) is poot.kernel_backend's;
`compile` turns the printed GLSL into SPIR-V (cached; its sizes lifted into
specialization constants, poot_vulkan.specialize) and keeps the workgroup counts the
kernel is dispatched with.
"""
from __future__ import annotations

from poot.codegen.lower.q8 import q8_program_for
from poot.codegen.lower.schedule import device_schedule
from poot.contract import Device
from poot.errors import DeviceUnavailable
from poot.kernel_backend import CompiledKernel, KernelBackend

from poot_vulkan.capability import capability_table
from poot_vulkan.compiler import compile_kernel
from poot_vulkan.device import BACKEND, open_device
from poot_vulkan.glsl import GlslPrinter, dispatch_groups, target_features
from poot_vulkan.probe import probe


class VulkanBackend(KernelBackend):
    name = BACKEND
    priority = 20  # over wgpu (same devices, recorded steps), under native GPU backends
    language = "spirv"

    def probe(self) -> list[Device]:
        return [Device(self.name, f.index, f.name, info=(
            ("device_type", f.device_type), ("api_version", ".".join(map(str, f.api_version))),
            ("driver", f.driver), ("subgroup_size", f.subgroup_size)))
            for f in probe().devices]

    def unavailable_reason(self) -> str | None:
        found = probe()
        return None if found.available else found.reason

    def _device(self, device: Device):
        if device.backend != self.name:
            raise DeviceUnavailable(f"backend {self.name} has no device {device.id}")
        return open_device(device.index)

    def capability_table(self, device: Device, formats: frozenset[str]):
        return capability_table(self._device(device).facts, device.id, formats)

    def features(self, device: Device) -> frozenset:
        return target_features(self._device(device).facts)

    def schedule(self, device: Device):
        facts = self._device(device).facts
        return device_schedule(self.features(device),
                               facts.limit("maxComputeSharedMemorySize"), facts.is_software)

    def program_for(self, op, operands, out, device: Device):
        """Q8PackedContraction, the backend's own where the table declares it."""
        return q8_program_for(self, op, operands, out, device)

    def printer(self, device: Device) -> GlslPrinter:
        return GlslPrinter(self._device(device).facts)

    def compile(self, kernel, source: str, device: Device) -> CompiledKernel:
        facts = self._device(device).facts
        return CompiledKernel(kernel, source, binary=compile_kernel(kernel, source, facts),
                              groups=dispatch_groups(kernel, facts))

    def runtime(self, device: Device):
        from poot_vulkan.runtime import VulkanRuntime

        return VulkanRuntime(device, self._device(device))


BACKEND_INSTANCE = VulkanBackend()
