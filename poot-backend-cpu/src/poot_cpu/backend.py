"""The cpu backend: probe (a C compiler and the host's ISA), capability facts, the host C
printer, and the runtime (one compiled library per plan). Plan-time lowering is the
seam's (poot.kernel_backend); the CPU-shaped source builders (packed contractions,
attention, ArgTopK) take their signatures through its `program_for` hook, after the
capability check and before the shared lowering."""
from __future__ import annotations

import functools
import os
import platform

from poot.contract import Device
from poot.errors import DeviceUnavailable
from poot.kernel_backend import CompiledProgram, KernelBackend

from poot_cpu.capability import table
from poot_cpu.printer import HostCPrinter


@functools.cache
def host_features() -> tuple[str, ...]:
    """The SIMD features of the host CPU the kernels use (from /proc/cpuinfo)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    return tuple(x for x in ("avx2", "fma", "f16c", "avx512f") if x in flags)
    except OSError:
        pass
    return ()


@functools.cache
def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


class CpuBackend(KernelBackend):
    name = "cpu"
    priority = 5      # over the reference backend (0), under every GPU backend
    language = "c"

    def probe(self) -> list[Device]:
        if self.unavailable_reason() is not None:
            return []
        from poot_cpu.compiler import compiler_version

        return [Device("cpu", 0, f"{cpu_name()}, {os.cpu_count()} threads", (
            ("compiler", compiler_version()), ("isa", ",".join(host_features())),
            ("threads", os.cpu_count())))]

    def unavailable_reason(self) -> str | None:
        from poot_cpu.compiler import compiler_version

        if platform.machine() not in ("x86_64", "AMD64", "aarch64", "arm64"):
            return f"no cpu device: unsupported host architecture {platform.machine()}"
        try:
            compiler_version()
        except DeviceUnavailable as e:
            return f"no cpu device: {e}"
        return None

    def capability_table(self, device: Device, formats: frozenset[str]):
        return table(device.id, formats)

    def printer(self, device: Device) -> HostCPrinter:
        return HostCPrinter(str(device))

    def program_for(self, op, operands, out, device: Device) -> CompiledProgram | None:
        """A CPU source builder's kernels where one takes the signature, else None (the
        shared lowering)."""
        from poot_cpu.attention import attention_program
        from poot_cpu.concat import concat_program
        from poot_cpu.convert import cast_program
        from poot_cpu.gemm import gemm_program
        from poot_cpu.gemv import gemv_program
        from poot_cpu.topk import topk_program

        for builder in (gemv_program, gemm_program, attention_program, topk_program,
                        cast_program, concat_program):
            compiled = builder(op, operands, out, self.printer(device))
            if compiled is not None:
                return compiled
        return None

    def runtime(self, device: Device):
        from poot_cpu.runtime import CpuRuntime

        return CpuRuntime(device)


BACKEND = CpuBackend()
__all__ = ["BACKEND", "CompiledProgram", "CpuBackend", "host_features"]
