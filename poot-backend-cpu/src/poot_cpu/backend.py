"""The cpu backend: probe (a C compiler and the host's ISA), capability table, plan-time
lowering (kernel programs printed as C now, so refusals come before anything runs),
runtime (one compiled library per plan)."""
from __future__ import annotations

import functools
import os
import platform

from poot.backend import Backend, Device
from poot.backend import Lowering as Choice
from poot.errors import DeviceUnavailable
from poot.ir.graph import Lit

from poot_cpu.capability import table
from poot_cpu.kernels import lower_eqn


@functools.cache
def host_features() -> tuple[str, ...]:
    """The SIMD features of the host CPU that the kernels use (from /proc/cpuinfo)."""
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


class CpuBackend(Backend):
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

    def capabilities(self, device: Device):
        from poot.formats import formats

        return _table(device.id, frozenset(formats()))

    def lower(self, eqn, graph, device: Device) -> Choice:
        ins = [x if isinstance(x, Lit) else graph.type_of(x.id) for x in eqn.inputs]
        types = [x.type if isinstance(x, Lit) else x for x in ins]
        out = graph.type_of(eqn.out)
        self.capabilities(device).check(eqn.op, types, out)
        compiled = lower_eqn(eqn.op, ins, out, device)
        return Choice(compiled.kind, compiled.launch, compiled,
                      dispatches=len(compiled.functions))

    def runtime(self, device: Device):
        from poot_cpu.runtime import CpuRuntime

        return CpuRuntime(device)


@functools.cache
def _table(device: str, formats: frozenset):
    return table(device, formats)


BACKEND = CpuBackend()
