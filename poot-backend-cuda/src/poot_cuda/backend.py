"""The CUDA backend: probe, capability table, plan-time lowering (print + NVRTC), runtime."""
from __future__ import annotations

import functools

from poot.backend import Backend, Device
from poot.backend import Lowering as Choice
from poot.codegen.lower import lower as lower_eqn
from poot.errors import DeviceUnavailable
from poot.ir.graph import Lit

from poot_cuda.capability import kernel_features, parse_arch, table
from poot_cuda.kernels import compile_lowering
from poot_cuda.printer import CudaPrinter
from poot_cuda.probe import probe


class CudaBackend(Backend):
    name = "cuda"
    priority = 100
    language = "cuda"

    def probe(self) -> list[Device]:
        devices, _ = probe()
        return [Device("cuda", d.index, d.name,
                       (("arch", d.arch), ("major", d.major), ("minor", d.minor),
                        ("total_bytes", d.total_bytes))) for d in devices]

    def unavailable_reason(self) -> str | None:
        return probe()[1]

    @staticmethod
    def compile_only_device(arch: str = "sm_90") -> Device:
        """A device record for planning and compiling without a GPU (CI's compile check)."""
        major, minor = parse_arch(arch)
        return Device("cuda", -1, f"compile-only {arch}",
                      (("arch", arch), ("major", major), ("minor", minor)))

    @staticmethod
    def _info(device: Device) -> dict:
        return dict(device.info)

    def capabilities(self, device: Device):
        info = self._info(device)
        from poot.formats import formats

        return _table(str(device), info["major"], info["minor"], tuple(sorted(formats())))

    def features(self, device: Device) -> frozenset:
        """Kernel statements beyond the core ones: async copies and mma.sync on sm_80+."""
        info = self._info(device)
        return kernel_features(info["major"], info["minor"])

    def printer(self, device: Device) -> CudaPrinter:
        return CudaPrinter(self._info(device)["arch"])

    def lower(self, eqn, graph, device: Device) -> Choice:
        ins = [x.type if isinstance(x, Lit) else graph.type_of(x.id) for x in eqn.inputs]
        out = graph.type_of(eqn.out)
        self.capabilities(device).check(eqn.op, ins, out)
        operands = [x if isinstance(x, Lit) else t for x, t in zip(eqn.inputs, ins, strict=True)]
        lowering = lower_eqn(eqn.op, operands, out, self.features(device))
        compiled = compile_lowering(lowering, self.printer(device))
        names = ",".join(k.kernel.name for k in compiled.kernels) or "alias"
        return Choice(names, compiled.launch, compiled, dispatches=len(compiled.kernels))

    def runtime(self, device: Device):
        if device.index < 0:
            raise DeviceUnavailable(f"{device} compiles only; it has no runtime")
        from poot_cuda.runtime import CudaRuntime

        return CudaRuntime(device)


@functools.cache
def _table(device: str, major: int, minor: int, formats: tuple):
    return table(device, major, minor, formats)
