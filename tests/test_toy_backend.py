"""The third-party toy backend (tests/plugins/poot-backend-toy, installed with
`pip install -e tests/plugins/poot-backend-toy`) passes the conformance suite, and
backends that lie about their table are caught by it.

Each suite run is pytest in-process (pytester); lying variants are registered
explicitly through `poot.plugin.register`, as an uninstalled plugin would be. What the
suite imports is imported here first, so that pytester's module snapshot keeps one copy
of each (the tracer's context lives in its module).
"""
from __future__ import annotations

import contextlib

import numpy as np
import poot.compiler  # noqa: F401  (imported before the in-process suite runs: see below)
import poot.conformance.model  # noqa: F401
import poot.models.llama  # noqa: F401
import pytest
from poot.dtypes import DType
from poot.errors import UnsupportedOp
from poot.plugin import hookimpl, manager, register, unregister

pytest_plugins = ["pytester"]

try:
    from poot_toy import ToyBackend
    from poot_toy.runtime import ToyExecutable, ToyRuntime
except ImportError as exc:  # the set-up must install it; say how instead of skipping
    raise ImportError("the toy backend is not installed: run "
                      "`pip install -e tests/plugins/poot-backend-toy`") from exc


def suite(pytester, backend: str, *extra: str):
    return pytester.runpytest_inprocess("--pyargs", "poot.conformance", "--poot-backend",
                                        backend, "-p", "no:cacheprovider", "-q", *extra)


class _Plugin:
    def __init__(self, backend):
        self.backend = backend

    @hookimpl
    def poot_backends(self):
        return [self.backend]


@contextlib.contextmanager
def registered(backend):
    plugin = _Plugin(backend)
    register(plugin, name=f"test:{backend.name}")
    try:
        yield backend
    finally:
        unregister(plugin)


# -- the honest toy --------------------------------------------------------------------------
def test_toy_is_found_through_its_entry_point():
    m = manager()
    assert "toy" in m.backends(), m.broken
    assert m.pm.get_plugin("toy") is not None  # the entry point name, not an explicit register


def test_toy_passes_the_suite(pytester):
    r = suite(pytester, "toy")
    out = r.stdout.str()
    assert r.ret == 0, out[-3000:]
    # its declared cases were checked and every other case was refused with the typed error
    from poot.conformance.cases import all_cases
    from poot.conformance.model import model_case_list
    from poot.conformance.target import resolve

    t = resolve("toy")
    cases = all_cases() + list(model_case_list())
    declared = sum(t.declares(c.graph) for c in cases)
    assert 0 < declared < len(cases)
    assert f"declared cases: {declared} matched the oracle, 0 failed" in out
    assert f"undeclared cases: {len(cases) - declared} refused" in out
    assert "0 not refused" in out and "refused with a typed error" in out


def test_poot_backends_lists_the_toy_table(capsys):
    from poot.cli import main

    assert main(["backends"]) == 0
    out = capsys.readouterr().out
    assert "toy (priority -1, toy-numpy, plugin toy)" in out  # found through its entry point
    assert "dtypes: f32:storage+arith" in out
    from poot.ir.ops import BinaryOp, UnaryOp

    assert f"Binary 5/{len(BinaryOp)}, Reduce 2/2, Unary 7/{len(UnaryOp)}" in out


# -- liars -----------------------------------------------------------------------------------
class WrongExp(ToyBackend):
    """Declares Unary.Exp and computes it 0.1% off."""

    name = "toy-wrong-exp"

    def lower(self, eqn, graph, device):
        lw = super().lower(eqn, graph, device)
        if lw.kernel == "toy.exp":
            lw.program = lambda x: np.exp(np.asarray(x, np.float64)) * 1.001
        return lw


class Overreach(ToyBackend):
    """Returns numbers for F16, which its table does not declare."""

    name = "toy-overreach"

    def lower(self, eqn, graph, device):
        if any(graph.type_of(v).dtype is DType.F16 for v in eqn.value_inputs()):
            from poot.backend import Lowering
            from poot_toy.kernels import kernel_for

            return Lowering("toy.f16", program=kernel_for(type(eqn.op).__name__,
                                                          eqn.op.op.name, eqn.op))
        return super().lower(eqn, graph, device)


class RefusesDeclared(ToyBackend):
    """Declares Unary.Tanh but refuses to lower it."""

    name = "toy-refuses-declared"

    def lower(self, eqn, graph, device):
        lw = super().lower(eqn, graph, device)
        if lw.kernel == "toy.tanh":
            raise UnsupportedOp("no tanh kernel", op="Unary.Tanh", backend=self.name,
                                device=device.id)
        return lw


class OobRuntime(ToyRuntime):
    """Writes one element past the end of every result."""

    def load(self, plan, buffers):
        exe = super().load(plan, buffers)
        spill = []
        for step in plan.steps:
            t, buf = step.out.type, buffers[step.out.region]
            end = step.out.offset + t.size * t.dtype.itemsize
            if end + t.dtype.itemsize <= buf.nbytes:
                tail = np.ndarray((1,), t.dtype.numpy, buf.data, end)
                spill.append(lambda tail=tail: tail.fill(7))
        return ToyExecutable(exe.calls + spill)


class OutOfBounds(ToyBackend):
    name = "toy-oob"

    def runtime(self, device):
        return OobRuntime(device)


LIARS = [
    # (variant, cases run, failures expected, what the failure says)
    (WrongExp, "Unary.Exp or Binary.Add", 2, "NMSE"),                     # Exp f32, 2 shapes
    (Overreach, "Unary.Neg", 2, "does not declare this case"),           # Neg f16, 2 shapes
    (RefusesDeclared, "Unary.Tanh and f32", 2, "declares Unary.Tanh on f32 but refused it"),
    (OutOfBounds, "Binary.Sub and f32", 3, "out-of-bounds write"),       # 3 shapes
]


@pytest.mark.parametrize("variant, cases, failures, says", LIARS,
                         ids=[v[0].__name__ for v in LIARS])
def test_suite_catches_a_lying_backend(pytester, variant, cases, failures, says):
    with registered(variant()):
        r = suite(pytester, variant.name, "-k", f"({cases}) and not model")
    out = r.stdout.str()
    assert r.parseoutcomes().get("failed") == failures, out[-3000:]
    assert says in out
