"""The `wgpu` Backend: probe, capability facts, the WGSL printer, the runtime.

Everything else (check -> lower -> print -> wrap) is poot.kernel_backend's; WGSL is
compiled by the runtime's kernel cache (naga, per device), so `compile` keeps the
printed source with the workgroup counts it is dispatched with.
"""
from __future__ import annotations

from poot.codegen.lower.q8 import q8_program_for
from poot.codegen.lower.schedule import device_schedule
from poot.contract import Device
from poot.errors import DeviceUnavailable
from poot.kernel_backend import CompiledKernel, KernelBackend

from poot_wgpu.capability import capability_table
from poot_wgpu.device import open_device, target_features
from poot_wgpu.kernel import dispatch_groups
from poot_wgpu.probe import probe
from poot_wgpu.wgsl import WgslPrinter
from poot_wgpu.wgsl.types import BACKEND


class WgpuBackend(KernelBackend):
    name = BACKEND
    priority = 10  # over the reference backend, under native GPU backends
    language = "wgsl"

    def probe(self) -> list[Device]:
        found = probe()
        return [Device(self.name, i, d.name, info=(
            ("backend_type", d.backend_type), ("adapter_type", d.adapter_type),
            ("vendor", d.vendor), ("driver", d.driver)))
            for i, d in enumerate(found.devices)]

    def unavailable_reason(self) -> str | None:
        found = probe()
        return None if found.available else found.reason

    def _device(self, device: Device):
        if device.backend != self.name or device.index != 0:
            raise DeviceUnavailable(f"backend {self.name} has no device {device.id}")
        return open_device()

    def capability_table(self, device: Device, formats: frozenset[str]):
        return capability_table(self._device(device), device.id, formats)

    def features(self, device: Device) -> frozenset:
        return target_features(self._device(device))

    def schedule(self, device: Device):
        dev = self._device(device)
        return device_schedule(self.features(device),
                               dev.limit("max-compute-workgroup-storage-size"), dev.is_software)

    def program_for(self, op, operands, out, device: Device):
        """Q8PackedContraction, the backend's own where the table declares it."""
        return q8_program_for(self, op, operands, out, device)

    def printer(self, device: Device) -> WgslPrinter:
        return WgslPrinter(self._device(device))

    def compile(self, kernel, source: str, device: Device) -> CompiledKernel:
        return CompiledKernel(kernel, source, groups=dispatch_groups(kernel,
                                                                     self._device(device)))

    def runtime(self, device: Device):
        from poot_wgpu.runtime import WgpuRuntime

        return WgpuRuntime(device, self._device(device))


BACKEND_INSTANCE = WgpuBackend()
