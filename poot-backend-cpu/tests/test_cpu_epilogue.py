"""A contraction epilogue over a packed weight runs inside the contraction's function
(no barrier between the two), against the oracle: a residual add in decode (the row
tiles) and a broadcast bias in a prefill chunk (the panel kernel); and its fallback when
the output overlaps the activations every thread reads."""
from __future__ import annotations

import ctypes

import numpy as np
import pytest
from poot.conformance.cases import T, case, one
from poot.conformance.compare import mismatch
from poot.conformance.inputs import Arg, draw_all
from poot.conformance.runner import run_case
from poot.dtypes import DType
from poot.formats import PackedWeight
from poot.ir import ops as O
from poot.ir import region
from poot.oracle import evaluate
from poot.plan import plan
from poot_cpu import compiler
from poot_cpu.printer import HostCPrinter

F32 = DType.F32


def _residual(b, h, r):
    return b.eqn(O.Binary(O.BinaryOp.Add), h, r)


def _epilogue_case(m: int, n: int, k: int, bias_rows: bool, fmt: str = "gguf:Q4_1",
                   head=O.PackedContraction):
    w = PackedWeight(fmt, (n, k))
    srcs = [Arg(s.type, ("packed", w, i)) for i, s in enumerate(w.sources())]
    bias = T((m, n) if bias_rows else (n,), F32)
    body = region([T((m, n), F32), bias], _residual)
    return case(f"ContractionEpilogue-{fmt}-{head.__name__}-{m}x{k}x{n}", "ContractionEpilogue",
                fmt, [Arg(T((m, k), F32))] + srcs + [Arg(bias)],
                one(O.ContractionEpilogue(head(w), 2, body)), exact=False, growth="compose")


# the exact head, and the fast precision's q8 rows over a K-quant (two scales per 32)
@pytest.mark.parametrize("fmt, head", [("gguf:Q4_1", O.PackedContraction),
                                       ("gguf:Q6_K", O.Q8PackedContraction)],
                         ids=["Q4_1", "Q8-Q6_K"])
@pytest.mark.parametrize("m, bias_rows", [(1, True), (12, False)])
def test_packed_contraction_epilogue_is_one_call(cpu_backend, m, bias_rows, fmt, head):
    c = _epilogue_case(m, 68, 512, bias_rows, fmt, head)
    device = cpu_backend.probe()[0]
    (step,) = plan(c.graph, (cpu_backend, device)).steps
    assert len(step.lowering.program.kernels) == 1
    rng = np.random.default_rng(0)
    inputs = draw_all(rng, c.args, c.fixed)
    (want,) = evaluate(c.graph, inputs, outputs="result")
    out = run_case(c.graph, inputs, cpu_backend, device, cpu_backend.runtime(device), rng)
    assert not out.problems
    assert mismatch(want, out.result, c.exact, c.tol) is None


def test_epilogue_output_over_the_activations_takes_the_barrier(cpu_backend):
    """out written over x: every thread quantizes x for itself, so a thread that wrote its
    outputs early would change another's input; the function waits at a barrier instead."""
    m, n, k = 1, 64, 64
    c = _epilogue_case(m, n, k, True)
    device = cpu_backend.probe()[0]
    (step,) = plan(c.graph, (cpu_backend, device)).steps
    (kernel,) = step.lowering.program.kernels
    rng = np.random.default_rng(1)
    inputs = draw_all(rng, c.args, c.fixed)
    (want,) = evaluate(c.graph, inputs, outputs="result")
    src = HostCPrinter().prelude(simd=True) + kernel.source + (
        "void run(const float* x, const unsigned char* w, float* y, unsigned char* s,\n"
        "         const float* b, float* out) {\n"
        f"  #pragma omp parallel\n  {kernel.name}(x, w, y, s, b, out);\n}}\n")
    fn = compiler.load(src).run
    fn.argtypes = [ctypes.c_void_p] * 6
    x = np.ascontiguousarray(inputs[0], np.float32).copy()      # also the output
    wq, bias = (np.ascontiguousarray(a) for a in inputs[1:])
    acc = np.zeros(m * n, np.float32)
    scratch = np.zeros(1 << 16, np.uint8)
    fn(x.ctypes.data, wq.ctypes.data, acc.ctypes.data, scratch.ctypes.data, bias.ctypes.data,
       x.ctypes.data)
    assert mismatch(want, x.reshape(m, n), c.exact, c.tol) is None
