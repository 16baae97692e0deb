"""The ROCm backend: probe, capability table per target, plan-time lowering (print +
hiprtc), runtime on hip-python.

A device's target comes from the device (its gcnArchName and wavefront width); a
compile-only device names it (`compile_only_device("gfx90a")`, "gfx1030",
"gfx1030:w64"), which is how CI builds code objects without an AMD GPU.
"""
from __future__ import annotations

from poot.backend import Device
from poot.codegen.program import KernelProgram
from poot.errors import DeviceUnavailable
from poot.kernel_backend import CompiledProgram, KernelBackend

from poot_rocm.archs import Target, target
from poot_rocm.capability import facts, table
from poot_rocm.kernels import compile_program
from poot_rocm.printer import HipPrinter
from poot_rocm.probe import probe


class RocmBackend(KernelBackend):
    name = "rocm"
    priority = 90
    language = "hip"

    def probe(self) -> list[Device]:
        devices, _ = probe()
        return [Device("rocm", d.index, d.name,
                       (("arch", d.arch), ("wavefront", d.wavefront),
                        ("lds_bytes", d.lds_bytes), ("total_bytes", d.total_bytes)))
                for d in devices]

    def unavailable_reason(self) -> str | None:
        return probe()[1]

    @staticmethod
    def compile_only_device(name: str = "gfx90a") -> Device:
        """A device record for planning and compiling without a GPU (CI's compile check)."""
        t = target(name)
        return Device("rocm", -1, f"compile-only {t.name}",
                      (("arch", t.arch.name), ("wavefront", t.wave)))

    @staticmethod
    def target(device: Device) -> Target:
        info = dict(device.info)
        return target(info["arch"], info.get("wavefront"))

    def capability_table(self, device: Device, formats: frozenset[str]):
        return table(str(device), self.target(device), tuple(sorted(formats)))

    def facts(self, device: Device) -> dict:
        return facts(self.target(device))

    def printer(self, device: Device) -> HipPrinter:
        return HipPrinter(self.target(device))

    def build(self, program: KernelProgram, device: Device) -> CompiledProgram:
        """The kernels of one eqn, printed and built as one hiprtc unit."""
        return compile_program(program, self.printer(device))

    def runtime(self, device: Device):
        if device.index < 0:
            raise DeviceUnavailable(f"{device} compiles only; it has no runtime")
        from poot_rocm.runtime import RocmRuntime

        return RocmRuntime(device)
