"""The checked layer over a stream-and-graph GPU driver (the CUDA driver API, HIP) that the
cuda and rocm backends share: one device with one stream for all work, copies queued on
it, modules and their functions, launches with their argument arrays built once, and a
step captured from the stream into a graph and replayed. poot.runtime.stream runs plans
on it.

What differs between drivers is one call each, which a backend's subclasses implement,
each checked (poot.simt_backend.checked) so that a failure names the call:

    StreamContext   make_current(), _malloc(nbytes) -> int, _free(ptr),
                    _to_device(ptr, host), _to_host(host, ptr), _device_copy(dst, src, nbytes),
                    _sync(), _load(code) -> module, _function(module, name)
    StreamGraph     _begin_capture(stream), _end_capture(stream) -> graph,
                    _instantiate(graph) -> executable graph, _launch(exec, stream)
    BoundLaunch     __call__(ctx): the launch on ctx's stream

The context is made current before every call that needs it (allocation, copies to and
from the host, module loads, capture); the driver's own `__init__` opens the device and
creates `self.stream`.
"""
from __future__ import annotations

from abc import ABC, abstractmethod

import numpy as np


class StreamContext(ABC):
    """One device with one stream for all work; see the module docstring for the calls a
    driver implements."""

    stream: object

    @abstractmethod
    def make_current(self) -> None:
        raise NotImplementedError

    def alloc(self, nbytes: int) -> int:
        self.make_current()
        return self._malloc(nbytes)

    def free(self, ptr: int) -> None:
        self._free(ptr)

    def write(self, ptr: int, array: np.ndarray) -> None:
        """Queue a host-to-device copy of `array` on the stream, without waiting for it."""
        host = np.ascontiguousarray(array)
        self.make_current()
        self._to_device(ptr, host)

    def read(self, ptr: int, nbytes: int) -> np.ndarray:
        """`nbytes` from the device once the work queued before them is done."""
        host = np.empty(nbytes, np.uint8)
        self.make_current()
        self._to_host(host, ptr)
        self.sync()
        return host

    def copy(self, dst: int, src: int, nbytes: int) -> None:
        """Device-to-device copy, queued on the stream (captured into graphs too)."""
        self._device_copy(dst, src, nbytes)

    def sync(self) -> None:
        self._sync()

    def load_module(self, code: bytes):
        self.make_current()
        return self._load(code)

    def function(self, module, name: str):
        return self._function(module, name)

    # the driver's calls
    @abstractmethod
    def _malloc(self, nbytes: int) -> int:
        raise NotImplementedError

    @abstractmethod
    def _free(self, ptr: int) -> None:
        raise NotImplementedError

    @abstractmethod
    def _to_device(self, ptr: int, host: np.ndarray) -> None:
        raise NotImplementedError

    @abstractmethod
    def _to_host(self, host: np.ndarray, ptr: int) -> None:
        raise NotImplementedError

    @abstractmethod
    def _device_copy(self, dst: int, src: int, nbytes: int) -> None:
        raise NotImplementedError

    @abstractmethod
    def _sync(self) -> None:
        raise NotImplementedError

    @abstractmethod
    def _load(self, code: bytes):
        raise NotImplementedError

    @abstractmethod
    def _function(self, module, name: str):
        raise NotImplementedError


class BoundLaunch(ABC):
    """One kernel launch with its arguments bound (pointers fixed at load time): device
    pointers, then values passed whole, passed the driver-API way, as an array of
    addresses each pointing at one argument value (the driver copies them at launch, so
    a graph captured from the stream keeps its own copy)."""

    def __init__(self, function, grid, block, pointers: list[int], name: str, by_value=()):
        self.function, self.name = function, name
        self.grid = tuple(grid) + (1,) * (3 - len(grid))
        self.block = tuple(block) + (1,) * (3 - len(block))
        self.values = np.array(pointers, dtype=np.uint64)
        self.by_value = [np.ascontiguousarray(v) for v in by_value]   # kept alive here
        self.addresses = np.array([self.values.ctypes.data + 8 * i
                                   for i in range(len(pointers))]
                                  + [v.ctypes.data for v in self.by_value], dtype=np.uint64)

    @abstractmethod
    def __call__(self, ctx: StreamContext) -> None:
        raise NotImplementedError


class StreamGraph(ABC):
    """A recorded step: `record()`'s stream work captured once, the instantiated graph
    replayed by `launch()`."""

    def __init__(self, ctx: StreamContext, record):
        self.ctx = ctx
        ctx.make_current()
        self._begin_capture(ctx.stream)
        try:
            record()
        finally:
            graph = self._end_capture(ctx.stream)
        self.graph = graph
        self.exec = self._instantiate(graph)

    def launch(self) -> None:
        self._launch(self.exec, self.ctx.stream)

    # the driver's calls
    @abstractmethod
    def _begin_capture(self, stream) -> None:
        raise NotImplementedError

    @abstractmethod
    def _end_capture(self, stream):
        raise NotImplementedError

    @abstractmethod
    def _instantiate(self, graph):
        raise NotImplementedError

    @abstractmethod
    def _launch(self, exec_graph, stream) -> None:
        raise NotImplementedError


__all__ = ["BoundLaunch", "StreamContext", "StreamGraph"]
