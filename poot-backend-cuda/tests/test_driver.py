"""The driver layer without a GPU: every CUDA driver call poot_cuda.driver makes exists in
cuda.bindings with the arguments it passes, and a step recorded on a stand-in for the
driver is captured once, with the context current, and replayed."""
from __future__ import annotations

import ast
import inspect
import types

import pytest
from poot_cuda import driver


def test_every_driver_call_exists_in_cuda_bindings_with_its_arity():
    cu = pytest.importorskip("cuda.bindings.driver")
    calls = {}
    for node in ast.walk(ast.parse(inspect.getsource(driver))):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr.startswith("cu"):
            starred = any(isinstance(a, ast.Starred) for a in node.args)
            calls[node.func.attr] = None if starred else len(node.args) + len(node.keywords)
    assert {"cuLaunchKernel", "cuLaunchKernelEx", "cuStreamBeginCapture", "cuGraphLaunch",
            "cuMemcpyHtoDAsync", "cuMemcpyDtoHAsync", "cuModuleLoadData"} <= set(calls)
    for name, nargs in calls.items():
        params = inspect.signature(getattr(cu, name)).parameters
        if nargs is not None and nargs != len(params):
            pytest.fail(f"{name} takes {list(params)}, the driver passes {nargs}")
    # the launch: 3 grid + 3 block + shared bytes, stream, kernelParams, extra after f
    assert len(inspect.signature(cu.cuLaunchKernel).parameters) == 11


class FakeCu:
    """The graph calls of poot_cuda.driver, recorded."""

    def __init__(self):
        self.CUresult = types.SimpleNamespace(CUDA_SUCCESS=0, CUDA_ERROR_OUT_OF_MEMORY=2)
        self.CUstreamCaptureMode = types.SimpleNamespace(CU_STREAM_CAPTURE_MODE_THREAD_LOCAL=1)
        self.log = []

    def cuCtxSetCurrent(self, context):
        self.log.append(("current", context))
        return (0,)

    def cuStreamBeginCapture(self, stream, mode):
        self.log.append(("begin", stream, mode))
        return (0,)

    def cuStreamEndCapture(self, stream):
        self.log.append(("end", stream))
        return (0, "graph")

    def cuGraphInstantiate(self, graph, flags):
        self.log.append(("instantiate", graph, flags))
        return (0, "exec")

    def cuGraphLaunch(self, exe, stream):
        self.log.append(("replay", exe, stream))
        return (0,)

    def cuGetErrorString(self, err):
        return (0, b"fake")


def test_a_step_is_captured_with_the_context_current_and_replayed(monkeypatch):
    fake = FakeCu()
    monkeypatch.setattr(driver, "cu", lambda: fake)
    ctx = object.__new__(driver.Context)
    ctx.context, ctx.stream = "primary", "stream"
    g = driver.Graph(ctx, lambda: fake.log.append(("work",)))
    g.launch()
    assert fake.log == [("current", "primary"), ("begin", "stream", 1), ("work",),
                        ("end", "stream"), ("instantiate", "graph", 0),
                        ("replay", "exec", "stream")]
