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
    # found through its entry point, named with its distribution and version
    assert "toy (priority -1, toy-numpy, plugin toy, poot-backend-toy 0.1.0)" in out
    assert "dtypes: f32:storage+arith" in out
    from poot.ir.ops import BinaryOp, UnaryOp

    assert f"Binary 6/{len(BinaryOp)}, Reduce 2/2, Unary 7/{len(UnaryOp)}" in out


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
            from poot.contract import Lowering
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


def _toward_zero(exact: np.ndarray, dtype) -> np.ndarray:
    """`exact` (float64) rounded toward zero to `dtype` instead of to nearest even."""
    r = exact.astype(dtype)
    over = np.abs(r.astype(np.float64)) > np.abs(exact)
    return np.where(over, np.nextafter(r, np.zeros_like(r)), r)


class RoundsTowardZero(ToyBackend):
    """Declares Binary.Add on F32 and F16 and rounds its sums toward zero."""

    name = "toy-rtz"

    def capabilities(self, device):
        from poot.capability import CapabilityTable, Use

        t = super().capabilities(device)
        ops = {k: set(v) for k, v in t.ops.items()}
        ops["Binary.Add"] |= {DType.F16}
        return CapabilityTable.declare(self.name, device.id,
                                       {DType.F32: Use.STORAGE | Use.ARITH,
                                        DType.F16: Use.STORAGE | Use.ARITH}, ops)

    def lower(self, eqn, graph, device):
        lw = super().lower(eqn, graph, device)
        if lw.kernel == "toy.add":
            lw.program = lambda a, b: _toward_zero(np.asarray(a, np.float64) + b, a.dtype)
        return lw


class NanOnZero(ToyBackend):
    """Multiplies correctly, except that a zero operand gives NaN."""

    name = "toy-nan-on-zero"

    def lower(self, eqn, graph, device):
        lw = super().lower(eqn, graph, device)
        if lw.kernel == "toy.mul":
            lw.program = lambda a, b: np.where((a == 0) | (b == 0), np.nan,
                                               np.asarray(a, np.float64) * b)
        return lw


class ShortK(ToyBackend):
    """Declares MatMul on F32 and sums only the first 2048 terms of K."""

    name = "toy-short-k"

    def capabilities(self, device):
        from poot.capability import CapabilityTable, Use

        t = super().capabilities(device)
        return CapabilityTable.declare(self.name, device.id, {DType.F32: Use.all()},
                                       {**t.ops, "MatMul": [DType.F32]})

    def lower(self, eqn, graph, device):
        if eqn.op.name != "MatMul":
            return super().lower(eqn, graph, device)
        from poot.contract import Lowering

        self.capabilities(device).check_eqn(eqn, graph)
        return Lowering("toy.matmul", program=lambda a, b: np.matmul(
            np.asarray(a, np.float64)[..., :2048], np.asarray(b, np.float64)[..., :2048, :]))


class HostComposites(ToyBackend):
    """A host-kernel backend (language "numpy") that declares Fused and returns zeros
    for it; it declares no collective."""

    name = "toy-host"
    language = "numpy"

    def capabilities(self, device):
        from poot.capability import CapabilityTable

        t = super().capabilities(device)
        return CapabilityTable.declare(self.name, device.id, t.dtypes,
                                       {**t.ops, "Fused": [DType.F32]})

    def lower(self, eqn, graph, device):
        if eqn.op.name != "Fused":
            return super().lower(eqn, graph, device)
        from poot.contract import Lowering

        self.capabilities(device).check_eqn(eqn, graph)
        return Lowering("toy.fused", program=lambda *xs: np.zeros(
            np.broadcast_shapes(*(x.shape for x in xs))))


#: what every failure line names besides the problem: op, dtype, shapes, seed, rerun
SEED = 20261129
LIARS = [
    # (variant, cases run, failures expected, what the failure says, a failing case id)
    (WrongExp, "Unary.Exp or Binary.Add", 2, "NMSE", "Unary.Exp-f32-3x257"),
    (Overreach, "Unary.Neg", 2, "does not declare this case", "Unary.Neg-f16-3x257"),
    (RefusesDeclared, "Unary.Tanh and f32", 2, "declares Unary.Tanh on f32 but refused it",
     "Unary.Tanh-f32-1"),
    (OutOfBounds, "Binary.Sub and f32", 3, "out-of-bounds write", "Binary.Sub-f32-1_1"),
    # rounding: correctly rounded sums compare bit for bit (f32 and f16; the two larger
    # shapes each: a single sum may happen to round the same both ways)
    (RoundsTowardZero, "Binary.Add and (f32 or f16)", 4, "not bit-exact",
     "Binary.Add-f16-3x257_3x257"),
    # zeros planted in the inputs (the two shapes large enough to plant them)
    (NanOnZero, "Binary.Mul and f32", 2, "got np.float32(nan)",
     "Binary.Mul-f32-3x257_3x257"),
    # realistic K: only the three long contractions fail, the short ones pass
    (ShortK, "MatMul-f32", 3, "NMSE", "MatMul-f32-longK-2x4099x3"),
    # a host-kernel backend's own composite kernel runs (it is not inlined away)
    (HostComposites, "Fused-f32", 1, "NMSE", "Fused-f32-3x257"),
]


@pytest.mark.parametrize("variant, cases, failures, says, failing", LIARS,
                         ids=[v[0].__name__ for v in LIARS])
def test_suite_catches_a_lying_backend(pytester, variant, cases, failures, says, failing):
    with registered(variant()):
        r = suite(pytester, variant.name, "-k", f"({cases}) and not model")
    out = r.stdout.str()
    assert r.parseoutcomes().get("failed") == failures, out[-3000:]
    assert says in out
    # every failure names op, dtype, operand shapes, seed and the exact rerun command
    key, dtype = failing.split("-")[0], failing.split("-")[1]
    rerun = f"rerun: poot conformance {variant.name} --seed {SEED} -k '{failing}' -- -v"
    line = next(ln for ln in out.splitlines() if rerun in ln)
    assert f"[{key} on {dtype}, operands " in line and f"seed {SEED}" in line, line


def test_a_host_backend_refuses_undeclared_collectives(pytester):
    """Composites of a host-kernel backend are checked against its table, not inlined
    past it: AllReduce and AllGather, undeclared, get the typed refusal."""
    with registered(HostComposites()):
        r = suite(pytester, "toy-host", "-k", "AllReduce or AllGather")
    outcomes = r.parseoutcomes()
    assert outcomes.get("passed") == 2 and "failed" not in outcomes, r.stdout.str()[-3000:]


def test_out_of_bounds_message_uses_one_coordinate_system(pytester):
    import re

    with registered(OutOfBounds()):
        r = suite(pytester, "toy-oob", "-k", "Binary.Sub-f32-3x257_3x257")
    m = re.search(r"first at planned byte (\d+) \(the arena holds (\d+) bytes; the result "
                  r"f32\[3,257\] is at planned bytes \[(\d+), (\d+)\)\)", r.stdout.str())
    assert m, r.stdout.str()[-3000:]
    first, arena, start, end = map(int, m.groups())
    assert end - start == 3 * 257 * 4 and first == end <= arena   # the element right after


def test_the_rerun_command_reruns_one_case_verbosely(pytester, monkeypatch):
    """The command a failure prints parses (`-k` before `--`), is verbose (no -q of its
    own once -v follows --), and selects exactly the failing case."""
    from poot.cli import main

    seen = []
    monkeypatch.setattr(pytest, "main", lambda argv: seen.append(argv) or 0)
    case = "Binary.Sub-f32-3x257_3x257"
    with registered(OutOfBounds()):
        assert main(["conformance", "toy-oob", "--seed", str(SEED), "-k", case, "--", "-v"]) == 0
        (argv,) = seen
        assert "-q" not in argv and argv[-1] == "-v" and argv[argv.index("-k") + 1] == case
        r = pytester.runpytest_inprocess(*argv)
    assert r.parseoutcomes().get("failed") == 1, r.stdout.str()[-3000:] + r.stderr.str()
    assert f"test_declared[{case}] FAILED" in r.stdout.str()
    # the header (printed when not -q) names the target and the seed
    assert (f"poot conformance: toy-oob on toy-oob:0 (toy numpy kernels (CPU)) (seed {SEED}; "
            f"rerun: poot conformance toy-oob --seed {SEED} -- -v)") in r.stdout.str()


def test_a_raising_probe_stops_the_suite_with_the_reason_not_an_internal_error(pytester):
    class ProbeRaises(ToyBackend):
        name = "toy-probe-raises"

        def probe(self):
            raise RuntimeError("driver exploded")

    with registered(ProbeRaises()):
        r = suite(pytester, "toy-probe-raises")
    text = r.stdout.str() + r.stderr.str()
    assert r.ret == pytest.ExitCode.USAGE_ERROR and "INTERNALERROR" not in text, text[-3000:]
    assert "has no device: probe() raised RuntimeError: driver exploded" in text
