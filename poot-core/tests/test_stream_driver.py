"""poot.runtime.stream_driver, the driver layer the CUDA and HIP backends share, on a
recording stand-in for a driver: which calls need the context current, reads that wait,
launches' argument arrays, and a capture that ends even when recording fails."""
from __future__ import annotations

import ctypes

import numpy as np
import pytest
from poot.runtime.stream_driver import BoundLaunch, StreamContext, StreamGraph


class Recording(StreamContext):
    """Every driver call as (name, args); host memory stands in for the device's."""

    def __init__(self):
        self.stream, self.log, self.memory = "s", [], {}

    def make_current(self):
        self.log.append(("current",))

    def _malloc(self, nbytes):
        self.log.append(("malloc", nbytes))
        ptr = 4096 * (len(self.memory) + 1)
        self.memory[ptr] = np.zeros(nbytes, np.uint8)
        return ptr

    def _free(self, ptr):
        self.log.append(("free", ptr))

    def _to_device(self, ptr, host):
        self.log.append(("to_device", ptr, host.nbytes))
        self.memory[ptr][: host.nbytes] = host.view(np.uint8).reshape(-1)

    def _to_host(self, host, ptr):
        self.log.append(("to_host", ptr, host.nbytes))
        host[:] = self.memory[ptr][: host.nbytes]

    def _device_copy(self, dst, src, nbytes):
        self.log.append(("copy", dst, src, nbytes))

    def _sync(self):
        self.log.append(("sync",))

    def _load(self, code):
        self.log.append(("load", code))
        return "module"

    def _function(self, module, name):
        self.log.append(("function", module, name))
        return name


def test_the_context_is_current_for_allocation_copies_and_loads_and_reads_wait():
    ctx = Recording()
    ptr = ctx.alloc(8)
    ctx.write(ptr, np.arange(2, dtype=np.float32))
    got = ctx.read(ptr, 8).view(np.float32)
    ctx.copy(ptr, ptr, 8)
    assert ctx.function(ctx.load_module(b"bin"), "k") == "k"
    ctx.free(ptr)
    assert got.tolist() == [0.0, 1.0]
    assert ctx.log == [("current",), ("malloc", 8),
                       ("current",), ("to_device", ptr, 8),
                       ("current",), ("to_host", ptr, 8), ("sync",),
                       ("copy", ptr, ptr, 8),
                       ("current",), ("load", b"bin"), ("function", "module", "k"),
                       ("free", ptr)]


def test_a_write_copies_a_strided_array_contiguously():
    ctx = Recording()
    ptr = ctx.alloc(8)
    ctx.write(ptr, np.arange(4, dtype=np.float32)[::2])
    assert ctx.memory[ptr].view(np.float32).tolist() == [0.0, 2.0]


class Launch(BoundLaunch):
    def __call__(self, ctx):
        ctx.log.append(("launch", self.function))


def test_a_launch_passes_the_address_of_each_argument_value():
    by_value = np.arange(16, dtype=np.uint8)
    launch = Launch("f", (3,), (32, 2), [111, 222], "k", by_value=[by_value])
    assert launch.grid == (3, 1, 1) and launch.block == (32, 2, 1)
    addrs = [int(a) for a in launch.addresses]
    assert [ctypes.c_uint64.from_address(a).value for a in addrs[:2]] == [111, 222]
    assert bytes((ctypes.c_uint8 * 16).from_address(addrs[2])) == by_value.tobytes()


class Graph(StreamGraph):
    def _begin_capture(self, stream):
        self.ctx.log.append(("begin", stream))

    def _end_capture(self, stream):
        self.ctx.log.append(("end", stream))
        return "graph"

    def _instantiate(self, graph):
        self.ctx.log.append(("instantiate", graph))
        return "exec"

    def _launch(self, exec_graph, stream):
        self.ctx.log.append(("replay", exec_graph, stream))


def test_a_graph_is_captured_once_and_replayed():
    ctx = Recording()
    g = Graph(ctx, lambda: ctx.log.append(("work",)))
    g.launch()
    g.launch()
    assert ctx.log == [("current",), ("begin", "s"), ("work",), ("end", "s"),
                       ("instantiate", "graph"), ("replay", "exec", "s"), ("replay", "exec", "s")]


def test_a_failed_recording_still_ends_the_capture():
    ctx = Recording()

    def fail():
        raise RuntimeError("launch failed")

    with pytest.raises(RuntimeError, match="launch failed"):
        Graph(ctx, fail)
    assert ctx.log[-1] == ("end", "s")
