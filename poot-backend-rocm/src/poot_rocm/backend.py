"""The ROCm backend: probe, capability table per target, plan-time lowering (print +
hiprtc), runtime on hip-python; what it shares with the CUDA backend (devices,
compile-only devices) is poot.simt_backend's.

A device's target comes from the device (its gcnArchName and wavefront width); a
compile-only device names it (`compile_only_device("gfx90a")`, "gfx1030",
"gfx1030:w64"), which is how CI builds code objects without an AMD GPU.
"""
from __future__ import annotations

from poot.codegen.program import KernelProgram
from poot.contract import Device
from poot.kernel_backend import SHARED_LOWERINGS, CompiledProgram, _op_key
from poot.simt_backend import SimtBackend

from poot_rocm.archs import Target, target
from poot_rocm.capability import facts, table
from poot_rocm.kernels import compile_program
from poot_rocm.printer import HipPrinter
from poot_rocm.probe import probe

_PROGRAMS: dict = {}     # lowered kernel programs by signature, features and schedule


class RocmBackend(SimtBackend):
    name = "rocm"
    priority = 90
    language = "hip"

    def found(self):
        return probe()

    def device(self, d) -> Device:
        return Device(self.name, d.index, d.name,
                      (("arch", d.arch), ("wavefront", d.wavefront),
                       ("lds_bytes", d.lds_bytes), ("total_bytes", d.total_bytes)))

    @classmethod
    def compile_only_device(cls, name: str = "gfx90a") -> Device:
        """A device record for planning and compiling without a GPU (CI's compile check)."""
        t = target(name)
        return cls.compile_only(t.name, (("arch", t.arch.name), ("wavefront", t.wave)))

    @staticmethod
    def target(device: Device) -> Target:
        info = dict(device.info)
        return target(info["arch"], info.get("wavefront"))

    def capability_table(self, device: Device, formats: frozenset[str]):
        return table(str(device), self.target(device), tuple(sorted(formats)))

    def facts(self, device: Device) -> dict:
        return facts(self.target(device))

    def _program(self, op, operands, out, device: Device) -> KernelProgram:
        """The lowering of a signature is the same on every target of equal features and
        schedule (only the printer knows the wavefront): made once per process for them
        all (CI's check plans every case for two targets)."""
        key = (_op_key(op), operands, out, self.features(device), self.schedule(device))
        try:
            return _PROGRAMS[key]
        except TypeError:          # an op holding unhashable parameters: never shared
            return super()._program(op, operands, out, device)
        except KeyError:
            pass
        if len(_PROGRAMS) >= 4 * SHARED_LOWERINGS:
            _PROGRAMS.clear()
        program = _PROGRAMS[key] = super()._program(op, operands, out, device)
        return program

    def forget_lowerings(self) -> None:
        super().forget_lowerings()
        _PROGRAMS.clear()

    def printer(self, device: Device) -> HipPrinter:
        return HipPrinter(self.target(device))

    def build(self, program: KernelProgram, device: Device) -> CompiledProgram:
        """The kernels of one eqn, printed and built as one hiprtc unit."""
        return compile_program(program, self.printer(device))

    def open_runtime(self, device: Device):
        from poot_rocm.runtime import RocmRuntime

        return RocmRuntime(device)
