"""A thin, checked layer over the HIP runtime (hip-python's `hip.hip`).

Every call's hipError_t is checked; a failure raises a typed poot error naming the
call. The shape follows poot_cuda.driver: one context (device and stream) per
runtime, module loading, launches with their argument arrays built once, and a
step captured from the stream into a graph and replayed.

hip-python returns (error, *results) for every call; device pointers come back
as DeviceArray objects, kept here as plain integers (`as_c_void_p().value`), which
every call that takes a pointer accepts. Kernel arguments are passed the
driver-API way: kernelParams is the address of an array of addresses, each
pointing at one argument value (hipModuleLaunchKernel copies them at launch, so a
graph captured from the stream keeps its own copy).
"""
from __future__ import annotations

import numpy as np
from poot.errors import DeviceUnavailable, PootError
from poot.optional import require
from poot.simt_backend import checked


class HipError(PootError):
    """A HIP runtime call failed."""


def hip():
    return require("hip.hip", "hip-python")


def check(result, what: str):
    """A HIP call's results; a failure raises HipError (CapacityError when out of memory)
    naming the call."""
    api = hip()
    return checked(result, what, ok=api.hipError_t.hipSuccess,
                   out_of_memory=api.hipError_t.hipErrorOutOfMemory,
                   message=api.hipGetErrorString, error=HipError)


def address(ptr) -> int:
    """A device pointer hip-python returned, as an integer address."""
    return int(ptr.as_c_void_p().value or 0)


class Context:
    """One device with one non-blocking stream for all work."""

    def __init__(self, index: int):
        from poot_rocm.toolchain import locate

        try:
            locate()
            api = hip()
            check(api.hipInit(0), "hipInit")
            check(api.hipSetDevice(index), f"hipSetDevice({index})")
        except PootError as e:
            raise DeviceUnavailable(f"no ROCm device: {e}") from None
        self.index = index
        self._staged: list[np.ndarray] = []      # host arrays of copies still queued
        self.stream = check(api.hipStreamCreateWithFlags(api.hipStreamNonBlocking),
                            "hipStreamCreateWithFlags")

    def make_current(self) -> None:
        check(hip().hipSetDevice(self.index), "hipSetDevice")

    def alloc(self, nbytes: int) -> int:
        self.make_current()
        return address(check(hip().hipMalloc(max(nbytes, 1)), f"hipMalloc({nbytes})"))

    def free(self, ptr: int) -> None:
        check(hip().hipFree(ptr), "hipFree")

    def write(self, ptr: int, array: np.ndarray) -> None:
        """Queue a host-to-device copy on the stream. `array` is kept alive until the
        next sync: from pageable memory the copy may still read it after the call."""
        host = np.ascontiguousarray(array)
        self._staged.append(host)
        check(hip().hipMemcpyHtoDAsync(ptr, host.ctypes.data, host.nbytes, self.stream),
              "hipMemcpyHtoDAsync")

    def read(self, ptr: int, nbytes: int) -> np.ndarray:
        host = np.empty(nbytes, np.uint8)
        check(hip().hipMemcpyDtoHAsync(host.ctypes.data, ptr, nbytes, self.stream),
              "hipMemcpyDtoHAsync")
        self.sync()
        return host

    def copy(self, dst: int, src: int, nbytes: int) -> None:
        """Device-to-device copy, queued on the stream (captured into graphs too)."""
        check(hip().hipMemcpyDtoDAsync(dst, src, nbytes, self.stream), "hipMemcpyDtoDAsync")

    def sync(self) -> None:
        check(hip().hipStreamSynchronize(self.stream), "hipStreamSynchronize")
        self._staged.clear()

    def load_module(self, code: bytes):
        self.make_current()
        image = np.frombuffer(code, np.uint8).copy()
        return check(hip().hipModuleLoadData(image.ctypes.data), "hipModuleLoadData")

    def function(self, module, name: str):
        return check(hip().hipModuleGetFunction(module, name.encode()),
                     f"hipModuleGetFunction({name})")


class Launch:
    """One kernel launch with its arguments bound (pointers fixed at load time)."""

    def __init__(self, function, grid, block, pointers: list[int], name: str):
        self.function, self.name = function, name
        self.grid = tuple(grid) + (1,) * (3 - len(grid))
        self.block = tuple(block) + (1,) * (3 - len(block))
        self.values = np.array(pointers, dtype=np.uint64)
        self.addresses = np.array([self.values.ctypes.data + 8 * i
                                   for i in range(len(pointers))], dtype=np.uint64)

    def __call__(self, ctx: Context) -> None:
        check(hip().hipModuleLaunchKernel(self.function, *self.grid, *self.block, 0,
                                          ctx.stream, self.addresses.ctypes.data, None),
              f"launch {self.name}")


class Graph:
    """A recorded step: capture the stream once, replay the instantiated graph."""

    def __init__(self, ctx: Context, record):
        api = hip()
        self.ctx = ctx
        mode = api.hipStreamCaptureMode.hipStreamCaptureModeThreadLocal
        check(api.hipStreamBeginCapture(ctx.stream, mode), "hipStreamBeginCapture")
        try:
            record()
        finally:
            graph = check(api.hipStreamEndCapture(ctx.stream), "hipStreamEndCapture")
        self.graph = graph
        self.exec = check(api.hipGraphInstantiateWithFlags(graph, 0),
                          "hipGraphInstantiateWithFlags")

    def launch(self) -> None:
        check(hip().hipGraphLaunch(self.exec, self.ctx.stream), "hipGraphLaunch")

    def close(self) -> None:
        check(hip().hipGraphExecDestroy(self.exec), "hipGraphExecDestroy")
        check(hip().hipGraphDestroy(self.graph), "hipGraphDestroy")
