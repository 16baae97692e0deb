"""poot.simt_backend, what the CUDA and ROCm backends share, on stand-ins for a driver:
checked calls, devices from the probe, compile-only devices refused a runtime, one module
per code object, and launches' pointers resolved by buffer."""
from __future__ import annotations

import enum
import types

import pytest
from poot.codegen.program import OUT, Access, BufferParam, Kernel
from poot.contract import Device
from poot.dtypes import DType
from poot.errors import CapacityError, DeviceUnavailable, PootError
from poot.kernel_backend import CompiledKernel, CompiledProgram
from poot.simt_backend import ModuleCache, SimtBackend, bound_kernels, checked


class Status(enum.Enum):
    OK = 0
    BAD_VALUE = 1
    OUT_OF_MEMORY = 2


class DriverError(PootError):
    pass


def call(result, message=lambda err: (Status.OK, b"what went wrong")):
    return checked(result, "cuThing(7)", ok=Status.OK, out_of_memory=Status.OUT_OF_MEMORY,
                   message=message, error=DriverError)


def test_checked_returns_the_results_and_names_a_failed_call():
    assert call((Status.OK,)) is None and call(Status.OK) is None
    assert call((Status.OK, 5)) == 5 and call((Status.OK, 5, 6)) == (5, 6)
    with pytest.raises(DriverError, match=r"^cuThing\(7\) failed: BAD_VALUE: what went wrong$"):
        call((Status.BAD_VALUE, None))
    with pytest.raises(CapacityError, match="OUT_OF_MEMORY"):
        call((Status.OUT_OF_MEMORY,))

    def broken(err):
        raise RuntimeError("no message")

    with pytest.raises(DriverError, match=r"failed: BAD_VALUE: $"):   # the text is a courtesy
        call((Status.BAD_VALUE,), broken)


class Toy(SimtBackend):
    name = "toygpu"

    def found(self):
        return (types.SimpleNamespace(index=0, name="Toy 1"),), None

    def device(self, record):
        return Device(self.name, record.index, record.name, (("arch", "t1"),))

    def open_runtime(self, device):
        return ("runtime", device.index)


def test_devices_come_from_the_probe_and_compile_only_ones_have_no_runtime():
    b = Toy()
    (d,) = b.probe()
    assert b.unavailable_reason() is None and b.runtime(d) == ("runtime", 0)
    c = Toy.compile_only("t9", (("arch", "t9"),))
    assert (c.backend, c.index, c.name) == ("toygpu", -1, "compile-only t9")
    with pytest.raises(DeviceUnavailable, match="compiles only"):
        b.runtime(c)


def test_one_module_per_code_object_and_pointers_by_buffer():
    loaded, shared = [], []
    ctx = types.SimpleNamespace(
        load_module=lambda code: loaded.append(code) or f"module{len(loaded)}",
        function=lambda module, name: (module, name),
        allow_dynamic_shared=lambda fn, n: shared.append((fn, n)))
    bufs = (BufferParam("x", DType.F32, Access.READ, 4, 0),
            BufferParam("tmp", DType.F32, Access.READ_WRITE, 4, None),
            BufferParam("y", DType.F32, Access.WRITE, 4, OUT))
    k1, k2 = (Kernel(name, bufs, (1,), (1,), ()) for name in ("k1", "k2"))
    compiled = CompiledProgram(None, (CompiledKernel(k1, "", b"code"),
                                      CompiledKernel(k2, "", b"code", dynamic_shared=64)), "t")
    got = list(bound_kernels(compiled, ModuleCache(ctx), {0: 100, OUT: 300}, {"tmp": 200}))
    assert loaded == [b"code"]
    assert [(ck.kernel.name, fn, ptrs) for ck, fn, ptrs in got] == [
        ("k1", ("module1", "k1"), {"x": 100, "tmp": 200, "y": 300}),
        ("k2", ("module1", "k2"), {"x": 100, "tmp": 200, "y": 300})]
    assert shared == [(("module1", "k2"), 64)]
