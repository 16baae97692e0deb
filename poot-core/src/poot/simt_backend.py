"""What the backends over a stream-and-graph GPU driver share (CUDA, HIP): finding devices
and naming compile-only ones, the driver's checked calls, and the load-time half of a
plan's kernels (modules loaded once per context, launches bound to device pointers).

Nothing here imports a driver binding: each backend passes its own (poot_cuda.driver,
poot_rocm.driver). The runtime half, buffers on the stream and graph capture, is
poot.runtime.stream's, over the driver layer both drivers subclass
(poot.runtime.stream_driver).

A backend subclasses `SimtBackend` and supplies, beyond what a KernelBackend supplies:

    found()                 its driver probe (cached): (records, None) or ((), reason)
    device(record)          one probe record as a Device
    open_runtime(device)    its runtime on a device that has one

and gets `probe`, `unavailable_reason`, `compile_only(target, info)` (a device record that
plans and compiles without a GPU, index -1: CI's compile check) and `runtime`, which
refuses such a device.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from poot.contract import Device
from poot.errors import CapacityError, DeviceUnavailable, PootError
from poot.kernel_backend import CompiledKernel, CompiledProgram, KernelBackend


class SimtBackend(KernelBackend):
    """A KernelBackend whose devices are GPUs behind a stream-and-graph driver; see the
    module docstring."""

    def found(self) -> tuple[tuple, str | None]:
        """The driver probe: (device records, None), or ((), why there is no device)."""
        raise NotImplementedError(f"backend {self.name} has no probe")

    def device(self, record) -> Device:
        """One record of the probe as a Device: its info holds what the capability table,
        the printer and the compiler read."""
        raise NotImplementedError(f"backend {self.name} makes no device records")

    def open_runtime(self, device: Device):
        """The runtime on `device`, a device with a GPU."""
        raise NotImplementedError(f"backend {self.name} has no runtime")

    def probe(self) -> list[Device]:
        records, _ = self.found()
        return [self.device(r) for r in records]

    def unavailable_reason(self) -> str | None:
        return self.found()[1]

    @classmethod
    def compile_only(cls, target: str, info: tuple) -> Device:
        """A device record for planning and compiling for `target` without a GPU."""
        return Device(cls.name, -1, f"compile-only {target}", info)

    def runtime(self, device: Device):
        if device.index < 0:
            raise DeviceUnavailable(f"{device} compiles only; it has no runtime")
        return self.open_runtime(device)


def checked(result, what: str, *, ok, out_of_memory, message: Callable,
            error: type[PootError]) -> Any:
    """The results of a driver call that returns (status, *results): None, the one result,
    or a tuple of them. Another status than `ok` raises, naming the call (`what`), the
    status and the driver's text for it (`message(status)` -> (status, text)): a
    CapacityError for `out_of_memory`, else `error`."""
    err, *rest = result if isinstance(result, tuple) else (result,)
    if err != ok:
        text = ""
        try:
            _, msg = message(err)
            text = msg.decode() if isinstance(msg, bytes) else str(msg)
        except Exception:  # noqa: BLE001 - the message is a courtesy
            pass
        cls = CapacityError if err == out_of_memory else error
        raise cls(f"{what} failed: {err.name}: {text}")
    if not rest:
        return None
    return rest[0] if len(rest) == 1 else tuple(rest)


class ModuleCache:
    """One loaded module per code object per context (the context's `load_module` and
    `function`), and each kernel's function, allowed the dynamic shared memory it launches
    with."""

    def __init__(self, ctx):
        self.ctx, self._modules = ctx, {}

    def code(self, ck: CompiledKernel) -> bytes:
        """The code object `ck` is loaded from: its binary."""
        return ck.binary

    def function(self, ck: CompiledKernel):
        code = self.code(ck)
        mod = self._modules.get(code)
        if mod is None:
            mod = self._modules[code] = self.ctx.load_module(code)
        fn = self.ctx.function(mod, ck.kernel.name)
        if ck.dynamic_shared:
            self.ctx.allow_dynamic_shared(fn, ck.dynamic_shared)
        return fn


def bound_kernels(compiled: CompiledProgram, modules: ModuleCache, operand_ptrs: dict[int, int],
                  scratch_ptrs: dict[str, int]) -> Iterator[tuple[CompiledKernel, Any, dict]]:
    """(kernel, its loaded function, {buffer parameter: device pointer} in parameter order)
    for each kernel of `compiled`: operands by index (OUT for the output), scratch buffers
    by name. A backend makes its launches from them."""
    for ck in compiled.kernels:
        ptrs = {b.name: scratch_ptrs[b.name] if b.operand is None else operand_ptrs[b.operand]
                for b in ck.kernel.buffers}
        yield ck, modules.function(ck), ptrs


__all__ = ["ModuleCache", "SimtBackend", "bound_kernels", "checked"]
