"""A thin, checked layer over the HIP runtime (hip-python's `hip.hip`).

Every call's hipError_t is checked; a failure raises a typed poot error naming the
call. What it shares with poot_cuda.driver (one context, device and stream, per
runtime; module loading; launches with their argument arrays built once; a step
captured from the stream into a graph and replayed) is poot.runtime.stream_driver's;
this module names the HIP call of each.

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
from poot.runtime.stream_driver import BoundLaunch, StreamContext, StreamGraph
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


class Context(StreamContext):
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

    def _malloc(self, nbytes: int) -> int:
        return address(check(hip().hipMalloc(max(nbytes, 1)), f"hipMalloc({nbytes})"))

    def _free(self, ptr: int) -> None:
        check(hip().hipFree(ptr), "hipFree")

    def _to_device(self, ptr: int, host: np.ndarray) -> None:
        # kept alive until the next sync: from pageable memory the copy may still read it
        # after the call
        self._staged.append(host)
        check(hip().hipMemcpyHtoDAsync(ptr, host.ctypes.data, host.nbytes, self.stream),
              "hipMemcpyHtoDAsync")

    def _to_host(self, host: np.ndarray, ptr: int) -> None:
        check(hip().hipMemcpyDtoHAsync(host.ctypes.data, ptr, host.nbytes, self.stream),
              "hipMemcpyDtoHAsync")

    def _device_copy(self, dst: int, src: int, nbytes: int) -> None:
        check(hip().hipMemcpyDtoDAsync(dst, src, nbytes, self.stream), "hipMemcpyDtoDAsync")

    def _sync(self) -> None:
        check(hip().hipStreamSynchronize(self.stream), "hipStreamSynchronize")
        self._staged.clear()

    def _load(self, code: bytes):
        image = np.frombuffer(code, np.uint8).copy()
        return check(hip().hipModuleLoadData(image.ctypes.data), "hipModuleLoadData")

    def _function(self, module, name: str):
        return check(hip().hipModuleGetFunction(module, name.encode()),
                     f"hipModuleGetFunction({name})")


class Launch(BoundLaunch):
    """One kernel launch with its arguments bound (pointers fixed at load time)."""

    def __call__(self, ctx: Context) -> None:
        check(hip().hipModuleLaunchKernel(self.function, *self.grid, *self.block, 0,
                                          ctx.stream, self.addresses.ctypes.data, None),
              f"launch {self.name}")


class Graph(StreamGraph):
    """A recorded step: capture the stream once, replay the instantiated graph."""

    def _begin_capture(self, stream) -> None:
        mode = hip().hipStreamCaptureMode.hipStreamCaptureModeThreadLocal
        check(hip().hipStreamBeginCapture(stream, mode), "hipStreamBeginCapture")

    def _end_capture(self, stream):
        return check(hip().hipStreamEndCapture(stream), "hipStreamEndCapture")

    def _instantiate(self, graph):
        return check(hip().hipGraphInstantiateWithFlags(graph, 0),
                     "hipGraphInstantiateWithFlags")

    def _launch(self, exec_graph, stream) -> None:
        check(hip().hipGraphLaunch(exec_graph, stream), "hipGraphLaunch")

    def close(self) -> None:
        check(hip().hipGraphExecDestroy(self.exec), "hipGraphExecDestroy")
        check(hip().hipGraphDestroy(self.graph), "hipGraphDestroy")
