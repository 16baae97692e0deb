"""The runtime without an AMD GPU: the probe's reason, every hip-python call the driver
makes exists with the arguments it passes, and a plan bound on a recording stand-in for
the HIP API is captured once as a graph and replayed, with each launch's arguments
pointing at the plan's buffers."""
from __future__ import annotations

import ast
import ctypes
import inspect
import types

import poot
import pytest
from poot import ops
from poot.contract import Device
from poot.errors import DeviceUnavailable
from poot.plan import plan
from poot.plugin import backends
from poot_rocm import driver
from poot_rocm.backend import RocmBackend
from poot_rocm.probe import probe
from poot_rocm.runtime import RocmRuntime


def test_probe_never_raises_and_explains():
    devices, reason = probe()
    assert bool(devices) != bool(reason)
    if not devices:
        assert reason.startswith("no ROCm device: ")


def test_registered_through_the_entry_point_with_its_reason():
    b = backends()["rocm"]
    assert isinstance(b, RocmBackend)
    assert (b.unavailable_reason() is None) == bool(b.probe())


def test_no_device_is_a_typed_refusal():
    b = RocmBackend()
    with pytest.raises(DeviceUnavailable):
        b.runtime(b.compile_only_device("gfx90a"))
    if not probe()[0]:
        with pytest.raises(DeviceUnavailable, match="no ROCm device"):
            RocmRuntime(Device("rocm", 0, "absent"))


def test_every_hip_call_exists_in_hip_python_with_its_arity():
    from poot_rocm.toolchain import locate

    locate()
    from hip import hip

    tree = ast.parse(inspect.getsource(driver))
    calls = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr.startswith("hip"):
            calls[node.func.attr] = len(node.args) + len(node.keywords)
    assert {"hipModuleLaunchKernel", "hipStreamBeginCapture", "hipGraphLaunch",
            "hipMemcpyHtoDAsync"} <= set(calls)
    for name, nargs in calls.items():
        fn = getattr(hip, name)
        params = inspect.signature(fn).parameters
        if nargs != len(params) and name != "hipModuleLaunchKernel":
            pytest.fail(f"{name} takes {list(params)}, the driver passes {nargs}")
    # the launch: 3 grid + 3 block + shared bytes, stream, kernelParams, extra after f
    assert len(inspect.signature(hip.hipModuleLaunchKernel).parameters) == 11


class FakeHip:
    """The HIP calls of poot_rocm.driver, recorded; capture collects launches."""

    def __init__(self):
        ok = types.SimpleNamespace(hipSuccess=0, hipErrorOutOfMemory=2)
        self.hipError_t = ok
        self.hipStreamCaptureMode = types.SimpleNamespace(hipStreamCaptureModeThreadLocal=1)
        self.log, self.capturing, self.captured = [], False, []

    def hipModuleLaunchKernel(self, f, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
        # kernelParams: an array of addresses, each holding one pointer argument
        array = ctypes.cast(params, ctypes.POINTER(ctypes.c_uint64))
        ptrs = [ctypes.c_uint64.from_address(array[i]).value for i in range(len(f.buffers))]
        entry = ("launch", str(f), (gx, gy, gz), (bx, by, bz), ptrs)
        (self.captured if self.capturing else self.log).append(entry)
        return (0,)

    def hipStreamBeginCapture(self, stream, mode):
        self.capturing = True
        return (0,)

    def hipStreamEndCapture(self, stream):
        self.capturing = False
        return (0, "graph")

    def hipGraphInstantiateWithFlags(self, graph, flags):
        return (0, "exec")

    def hipGraphLaunch(self, exe, stream):
        self.log.append(("replay", len(self.captured)))
        return (0,)

    def hipGetErrorString(self, err):
        return (0, b"fake")


class FakeContext:
    """poot_rocm.driver.Context's surface on host memory."""

    def __init__(self):
        self.next, self.stream = 4096, "stream"
        self.copies, self.syncs = [], 0

    def make_current(self):
        pass

    def alloc(self, nbytes):
        ptr, self.next = self.next, self.next + -(-nbytes // 256) * 256
        return ptr

    def free(self, ptr):
        pass

    def copy(self, dst, src, nbytes):
        self.copies.append((dst, src, nbytes))

    def sync(self):
        self.syncs += 1

    def load_module(self, code):
        return types.SimpleNamespace(code=code)

    def function(self, module, name):
        return name


def test_a_step_is_captured_once_and_replayed(monkeypatch, tmp_path):
    monkeypatch.setenv("POOT_CACHE", str(tmp_path))
    fake = FakeHip()
    monkeypatch.setattr(driver, "hip", lambda: fake)
    b = RocmBackend()
    dev = b.compile_only_device("gfx90a")
    g = poot.trace(lambda tok, a, w: ops.rms_norm(ops.gather(a, tok), w, 1e-5),
                   poot.spec((2,), "i32", name="tok", kind="slot", slot="Token", bound=4),
                   poot.spec((4, 96), name="a"), poot.spec((96,), name="w"))
    p = plan(poot.compile(g, (b, dev)), (b, dev))
    kernels = {ck.kernel.name: ck.kernel for s in p.steps for ck in s.lowering.program.kernels}

    class Function(str):
        @property
        def buffers(self):
            return kernels[self].buffers

    ctx = FakeContext()
    ctx.function = lambda module, name: Function(name)
    rt = RocmRuntime(Device("rocm", 0, "fake gfx90a", (("arch", "gfx90a"),)), context=ctx)
    buffers = {r.name: rt.alloc(r.nbytes, r.name) for r in p.regions.values()}
    ex = rt.load(p, buffers)
    for _ in range(3):
        ex.run()
    assert ex.recorded
    assert [e[0] for e in fake.log] == ["replay"] * 3          # recorded once, replayed
    assert [e[1] for e in fake.captured] == [ck.kernel.name for s in p.steps
                                             for ck in s.lowering.program.kernels]
    owned = [(b_.ptr, b_.ptr + b_.nbytes) for b_ in rt._buffers]   # regions and scratch
    for _, name, grid, block, ptrs in fake.captured:
        k = kernels[name]
        assert grid == k.grid3() and block == k.workgroup3()
        assert len(ptrs) == len(k.buffers)
        assert all(any(lo <= q < hi for lo, hi in owned) for q in ptrs), ptrs
    ex.replay = False
    ex.run()
    assert [e[0] for e in fake.log[-len(fake.captured):]] == ["launch"] * len(fake.captured)


def test_prebuild_without_a_device_says_why(capsys):
    from poot_rocm import prebuild

    if probe()[0]:
        pytest.skip("a ROCm device is present")
    assert prebuild.main([]) == 2
    assert "no ROCm device" in capsys.readouterr().err
