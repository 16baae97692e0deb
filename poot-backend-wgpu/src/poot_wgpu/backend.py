"""The `wgpu` Backend: probe, capability table, plan-time lowering to printed WGSL."""
from __future__ import annotations

from poot.backend import Backend, Device, Lowering
from poot.errors import DeviceUnavailable

from poot_wgpu.capability import capability_table
from poot_wgpu.device import open_device
from poot_wgpu.probe import probe
from poot_wgpu.wgsl import print_kernel
from poot_wgpu.wgsl.types import BACKEND


class WgpuBackend(Backend):
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

    def capabilities(self, device: Device):
        # one table per device and set of registered formats: plan-time lowering consults
        # it for every eqn
        from poot.formats import formats

        key = (device.id, frozenset(formats()))
        tables = self.__dict__.setdefault("_tables", {})
        if key not in tables:
            tables[key] = capability_table(self._device(device), device.id)
        return tables[key]

    def lower(self, eqn, graph, device: Device) -> Lowering:
        """Check the table, build the kernel programs and print them now, so that every
        refusal (dtype, limit) comes at plan time, before anything runs."""
        from poot.codegen.lower import lower
        from poot.ir.graph import Lit

        ins = [x if isinstance(x, Lit) else graph.type_of(x.id) for x in eqn.inputs]
        types = [x.type if isinstance(x, Lit) else x for x in ins]
        out = graph.type_of(eqn.out)
        self.capabilities(device).check(eqn.op, types, out)
        program = lower(eqn.op, ins, out)
        dev = self._device(device)
        printed = tuple(print_kernel(k, dev) for k in program.kernels)
        launch = "; ".join(f"{p.groups}x{k.workgroup}"
                           for p, k in zip(printed, program.kernels, strict=True))
        kind = "alias" if not printed else (program.kernels[0].name.split("_")[1]
                                            if program.kernels[0].name.startswith("poot_")
                                            else program.kernels[0].name)
        return Lowering(kind, launch=launch, program=(program, printed),
                        dispatches=len(printed), extra={"alias": program.alias})

    def runtime(self, device: Device):
        from poot_wgpu.runtime import WgpuRuntime

        return WgpuRuntime(device, self._device(device))


BACKEND_INSTANCE = WgpuBackend()
