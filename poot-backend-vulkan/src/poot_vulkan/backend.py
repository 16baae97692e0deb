"""The `vulkan` Backend: probe, capability table, plan-time lowering to SPIR-V."""
from __future__ import annotations

from poot.backend import Backend, Device, Lowering
from poot.errors import DeviceUnavailable

from poot_vulkan.capability import capability_table
from poot_vulkan.device import BACKEND, open_device
from poot_vulkan.probe import probe


class VulkanBackend(Backend):
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

    def capabilities(self, device: Device):
        # one table per device and set of registered formats: lowering reads it per eqn
        from poot.formats import formats

        key = (device.id, frozenset(formats()))
        tables = self.__dict__.setdefault("_tables", {})
        if key not in tables:
            tables[key] = capability_table(self._device(device).facts, device.id)
        return tables[key]

    def lower(self, eqn, graph, device: Device) -> Lowering:
        """Check the table, build the kernel programs, print and compile them now, so
        every refusal (dtype, limit, compiler) comes at plan time, before anything runs."""
        from poot.codegen.lower import lower
        from poot.ir.graph import Lit

        from poot_vulkan.glsl import print_kernel
        from poot_vulkan.runtime import compile_printed

        ins = [x if isinstance(x, Lit) else graph.type_of(x.id) for x in eqn.inputs]
        types = [x.type if isinstance(x, Lit) else x for x in ins]
        out = graph.type_of(eqn.out)
        self.capabilities(device).check(eqn.op, types, out)
        program = lower(eqn.op, ins, out)
        dev = self._device(device)
        printed = tuple(print_kernel(k, dev.facts) for k in program.kernels)
        spirv = compile_printed(printed, dev)
        launch = "; ".join(f"{p.groups}x{k.workgroup}"
                           for p, k in zip(printed, program.kernels, strict=True))
        kind = "alias" if not printed else (program.kernels[0].name.split("_")[1]
                                            if program.kernels[0].name.startswith("poot_")
                                            else program.kernels[0].name)
        return Lowering(kind, launch=launch, program=(program, printed, spirv),
                        dispatches=len(printed), extra={"alias": program.alias})

    def runtime(self, device: Device):
        from poot_vulkan.runtime import VulkanRuntime

        return VulkanRuntime(device, self._device(device))


BACKEND_INSTANCE = VulkanBackend()
