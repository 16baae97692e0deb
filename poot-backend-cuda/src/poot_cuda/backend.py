"""The CUDA backend: probe, capability facts, the CUDA C printer, NVRTC, runtime.

Everything else (check -> lower -> print -> compile -> wrap) is poot.kernel_backend's, and
what it shares with the ROCm backend (devices, compile-only devices) poot.simt_backend's.
"""
from __future__ import annotations

from poot.contract import Device
from poot.errors import DeviceUnavailable
from poot.kernel_backend import CompiledKernel
from poot.simt_backend import SimtBackend

from poot_cuda.capability import kernel_features, parse_arch, table
from poot_cuda.printer import CudaPrinter
from poot_cuda.probe import probe


class CudaBackend(SimtBackend):
    name = "cuda"
    priority = 100
    language = "cuda"

    def found(self):
        return probe()

    def device(self, d) -> Device:
        return Device(self.name, d.index, d.name,
                      (("arch", d.arch), ("major", d.major), ("minor", d.minor),
                       ("total_bytes", d.total_bytes)))

    @classmethod
    def compile_only_device(cls, arch: str = "sm_90") -> Device:
        """A device record for planning and compiling without a GPU (CI's compile check)."""
        major, minor = parse_arch(arch)
        return cls.compile_only(arch, (("arch", arch), ("major", major), ("minor", minor)))

    @staticmethod
    def _info(device: Device) -> dict:
        return dict(device.info)

    def capability_table(self, device: Device, formats: frozenset[str]):
        info = self._info(device)
        return table(str(device), info["major"], info["minor"], tuple(sorted(formats)))

    def features(self, device: Device) -> frozenset:
        """Kernel statements beyond the core ones: async copies and mma.sync on sm_80+,
        wgmma and bulk tensor copies on sm_90a."""
        info = self._info(device)
        return kernel_features(info["major"], info["minor"], info["arch"])

    def program_for(self, op, operands, out, device: Device):
        """Q8PackedContraction, which the table declares as the backend's own (the shared
        integer GEMV of poot.codegen.lower.q8, by dp4a: target.DOT2); every other op
        through poot.codegen.lower."""
        from poot.codegen.lower.q8 import q8_program_for

        return q8_program_for(self, op, operands, out, device)

    def printer(self, device: Device) -> CudaPrinter:
        return CudaPrinter(self._info(device)["arch"])

    def compile(self, kernel, source: str, device: Device) -> CompiledKernel:
        from poot_cuda.kernels import compile_kernel

        return compile_kernel(kernel, source, self._info(device)["arch"])

    def tensor_parallel_group(self, ranks: int):
        """One process per GPU (GPUs 0..ranks-1), NCCL between them (poot_cuda.nccl)."""
        from poot_cuda.nccl import NcclGroup

        have = len(self.probe())
        if have < ranks:
            raise DeviceUnavailable(f"tensor parallelism over {ranks} ranks needs {ranks} GPUs; "
                                    f"this machine has {have}")
        return NcclGroup.create(ranks)

    def open_runtime(self, device: Device):
        from poot_cuda.runtime import CudaRuntime

        return CudaRuntime(device)
