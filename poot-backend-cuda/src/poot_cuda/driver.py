"""A thin, checked layer over the CUDA driver API (cuda.bindings.driver).

Every call's CUresult is checked; a failure raises a typed poot error naming
the call. What the HIP driver shares (the context's copies and module loads made current,
launches' argument arrays, graph capture and replay) is poot.runtime.stream_driver's; this
module names the CUDA call of each, plus what only CUDA has (page-locked reads behind an
event, dynamic shared memory past 48 KiB, programmatic dependent launches). Kernel
arguments are device pointers, then values passed whole (tensor maps).
"""
from __future__ import annotations

import ctypes

import numpy as np
from poot.errors import DeviceUnavailable, PootError
from poot.optional import require
from poot.runtime.stream_driver import BoundLaunch, StreamContext, StreamGraph
from poot.simt_backend import checked


class CudaError(PootError):
    """A CUDA driver call failed."""


def cu():
    return require("cuda.bindings.driver", "cuda-bindings")


def check(result, what: str):
    """A driver call's results; a failure raises CudaError (CapacityError when out of
    memory) naming the call."""
    driver = cu()
    return checked(result, what, ok=driver.CUresult.CUDA_SUCCESS,
                   out_of_memory=driver.CUresult.CUDA_ERROR_OUT_OF_MEMORY,
                   message=driver.cuGetErrorString, error=CudaError)


class Context(StreamContext):
    """The primary context of one device, with one stream for all work."""

    def __init__(self, index: int):
        driver = cu()
        try:
            check(driver.cuInit(0), "cuInit")
        except Exception as e:  # noqa: BLE001 - no driver raises, it does not return
            raise DeviceUnavailable(f"no CUDA device: {e}") from None
        self.device = check(driver.cuDeviceGet(index), "cuDeviceGet")
        self.context = check(driver.cuDevicePrimaryCtxRetain(self.device),
                             "cuDevicePrimaryCtxRetain")
        self.make_current()
        self.stream = check(driver.cuStreamCreate(
            int(driver.CUstream_flags.CU_STREAM_NON_BLOCKING)), "cuStreamCreate")
        #: read_later's page-locked buffers and their events, free ones by size
        self._staging: dict[int, list] = {}

    def make_current(self):
        check(cu().cuCtxSetCurrent(self.context), "cuCtxSetCurrent")

    def _malloc(self, nbytes: int) -> int:
        return int(check(cu().cuMemAlloc(max(nbytes, 1)), f"cuMemAlloc({nbytes})"))

    def _free(self, ptr: int) -> None:
        check(cu().cuMemFree(ptr), "cuMemFree")

    def _to_device(self, ptr: int, host: np.ndarray) -> None:
        # from pageable memory (numpy) the driver stages the bytes before returning, so the
        # array may change at once; no wait: a decode step writes its slots and launches
        # without a round trip per slot
        check(cu().cuMemcpyHtoDAsync(ptr, host.ctypes.data, host.nbytes, self.stream),
              "cuMemcpyHtoDAsync")

    def _to_host(self, host: np.ndarray, ptr: int) -> None:
        check(cu().cuMemcpyDtoHAsync(host.ctypes.data, ptr, host.nbytes, self.stream),
              "cuMemcpyDtoHAsync")

    def read_later(self, ptr: int, nbytes: int):
        """Queue a device-to-host copy into page-locked memory (truly asynchronous, unlike
        a copy into numpy's pageable memory) and an event behind it; returns `wait()`,
        which waits for that event alone and returns a copy of the bytes. The page-locked
        buffer goes back to a free list for the next read of its size."""
        self.make_current()
        free = self._staging.setdefault(nbytes, [])
        host, event = free.pop() if free else self._staging_pair(nbytes)
        self._to_host(host, ptr)
        check(cu().cuEventRecord(event, self.stream), "cuEventRecord")

        def wait() -> np.ndarray:
            check(cu().cuEventSynchronize(event), "cuEventSynchronize")
            out = host.copy()
            free.append((host, event))
            return out

        return wait

    def _staging_pair(self, nbytes: int):
        driver = cu()
        addr = int(check(driver.cuMemHostAlloc(max(nbytes, 1), 0), "cuMemHostAlloc"))
        host = np.ctypeslib.as_array((ctypes.c_uint8 * nbytes).from_address(addr))
        flags = int(driver.CUevent_flags.CU_EVENT_DISABLE_TIMING)
        return host, check(driver.cuEventCreate(flags), "cuEventCreate")

    def _device_copy(self, dst: int, src: int, nbytes: int) -> None:
        check(cu().cuMemcpyDtoDAsync(dst, src, nbytes, self.stream), "cuMemcpyDtoDAsync")

    def _sync(self) -> None:
        check(cu().cuStreamSynchronize(self.stream), "cuStreamSynchronize")

    def _load(self, cubin: bytes):
        return check(cu().cuModuleLoadData(cubin), "cuModuleLoadData")

    def allow_dynamic_shared(self, function, nbytes: int) -> None:
        """Let `function` launch with `nbytes` of dynamic shared memory (past 48 KiB)."""
        attr = cu().CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
        check(cu().cuFuncSetAttribute(function, attr, nbytes), "cuFuncSetAttribute")

    def _function(self, module, name: str):
        return check(cu().cuModuleGetFunction(module, name.encode()),
                     f"cuModuleGetFunction({name})")


class Launch(BoundLaunch):
    """One kernel launch with its arguments bound (pointers fixed at load time)."""

    def __init__(self, function, grid, block, pointers: list[int], name: str,
                 shared_bytes: int = 0, overlap: bool = False, by_value=()):
        super().__init__(function, grid, block, pointers, name, by_value)
        self.shared_bytes = shared_bytes
        self.overlap = overlap      # programmatic dependent launch (see CudaPrinter.entry)
        self._config = None

    def __call__(self, ctx: Context) -> None:
        if self.overlap:
            check(cu().cuLaunchKernelEx(self._overlap_config(ctx), self.function,
                                        self.addresses.ctypes.data, 0), f"launch {self.name}")
            return
        check(cu().cuLaunchKernel(self.function, *self.grid, *self.block, self.shared_bytes,
                                  ctx.stream,
                                  self.addresses.ctypes.data, 0), f"launch {self.name}")

    def _overlap_config(self, ctx: Context):
        """The launch config allowing this kernel to start before the previous kernel of
        the stream finishes (it waits inside, in griddepcontrol.wait)."""
        if self._config is None:
            driver = cu()
            cfg = driver.CUlaunchConfig()
            cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ = self.grid
            cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ = self.block
            cfg.sharedMemBytes, cfg.hStream = self.shared_bytes, ctx.stream
            attr = driver.CUlaunchAttribute()
            ids = driver.CUlaunchAttributeID
            attr.id = ids.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
            attr.value.programmaticStreamSerializationAllowed = 1
            cfg.attrs, cfg.numAttrs = [attr], 1
            self._config = cfg
        return self._config


class Graph(StreamGraph):
    """A recorded step: capture the stream once, replay the instantiated graph."""

    def _begin_capture(self, stream) -> None:
        mode = cu().CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL
        check(cu().cuStreamBeginCapture(stream, mode), "cuStreamBeginCapture")

    def _end_capture(self, stream):
        return check(cu().cuStreamEndCapture(stream), "cuStreamEndCapture")

    def _instantiate(self, graph):
        return check(cu().cuGraphInstantiate(graph, 0), "cuGraphInstantiate")

    def _launch(self, exec_graph, stream) -> None:
        check(cu().cuGraphLaunch(exec_graph, stream), "cuGraphLaunch")
