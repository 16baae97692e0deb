"""The dense GEMM (poot_cpu.gemm): each instruction-set path and every weight layout on an
odd shape (edge tiles of every path's MR and NR, K over three blocks, three row tiles over
the threads), against float64;
and through the plan, a dense contraction and a ContractionEpilogue over one against the
oracle at the conformance tolerance, as one call."""
from __future__ import annotations

import ctypes

import numpy as np
import pytest
from poot.conformance.cases import T, case, one
from poot.conformance.compare import mismatch
from poot.conformance.inputs import Arg, draw_all
from poot.conformance.runner import run_case
from poot.dtypes import DType
from poot.ir import ops as O
from poot.ir import region
from poot.oracle import evaluate
from poot.plan import plan
from poot_cpu import compiler
from poot_cpu.gemm import GEMM_FROM, LOCAL_ROWS, kernel_source, packed_bytes
from poot_cpu.printer import HostCPrinter

F32, BF16, F16, U32 = DType.F32, DType.BF16, DType.F16, DType.U32

# each path compiled by turning the host's wider features off, with the CPU flags a host
# needs to run it; and (MR, NR) the path's tile, which the probe reads back
ISAS = {
    "avx512": ((), {"avx512f", "avx2", "fma", "f16c"}, (8, 32)),
    "avx2": (("-mno-avx512f",), {"avx2", "fma", "f16c"}, (6, 16)),
    "scalar": (("-mno-avx2",), set(), (4, 16)),
}


def _flags(isa: str):
    extra, needs, _ = ISAS[isa]
    missing = needs - compiler.cpu_flags()
    if missing:
        pytest.skip(f"this CPU has no {', '.join(sorted(missing))}: the {isa} path cannot run")
    return compiler.FLAGS + extra


def _run(x: np.ndarray, w: np.ndarray, wdtype: DType | str, isa: str) -> np.ndarray:
    m, k = x.shape
    n = w.shape[1] if wdtype == "kn" else w.shape[0]
    src = HostCPrinter().prelude(simd=True) + kernel_source("g", wdtype, m, n, k) + (
        "int tile(void) { return POOT_GEMM_MR * 100 + POOT_GEMM_NR; }\n"
        "void run(const float* x, const void* w, float* y, float* bp) {\n"
        "  #pragma omp parallel\n  g(x, w, y, bp);\n}\n")
    lib = compiler.load(src, _flags(isa))
    assert divmod(lib.tile(), 100) == ISAS[isa][2]
    lib.run.argtypes = [ctypes.c_void_p] * 4
    y = np.full((m, n), np.nan, np.float32)
    bp = np.full(packed_bytes(m, n, k) // 4, np.nan, np.float32)
    lib.run(x.ctypes.data, w.ctypes.data, y.ctypes.data, bp.ctypes.data)
    return y


def _bf16(a: np.ndarray) -> np.ndarray:
    """a rounded to bf16 (nearest even), as the words and their f32 values."""
    u = a.astype(np.float32).view(np.uint32)
    words = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    return words, (words.astype(np.uint32) << 16).view(np.float32)


# rows past LOCAL_ROWS: the weight packed once per call; fewer: per tile, as it goes
SHAPES = [((301, 70, 600), w) for w in (F32, BF16, F16, "kn")] + \
    [((LOCAL_ROWS - 3, 70, 300), F32)]


@pytest.mark.parametrize("isa", sorted(ISAS))
@pytest.mark.parametrize("shape, wdtype", SHAPES, ids=lambda v: "x".join(map(str, v))
                         if isinstance(v, tuple) else str(v))
def test_gemm_matches_float64(cpu_backend, isa, shape, wdtype):
    m, n, k = shape
    rng = np.random.default_rng(m + n + k)
    x = rng.standard_normal((m, k), dtype=np.float32)
    w32 = rng.standard_normal((n, k), dtype=np.float32)
    if wdtype is BF16:
        w, wv = _bf16(w32)
    elif wdtype is F16:
        w = w32.astype(np.float16)
        wv = w.astype(np.float32)
    elif wdtype == "kn":
        wv = w32
        w = w32.T
    else:
        w = wv = w32
    y = _run(x, np.ascontiguousarray(w), wdtype, isa)
    want = x.astype(np.float64) @ wv.astype(np.float64).T
    # every output is an in-order f32 chain over k: its error grows with sqrt(k) at most
    bound = 4 * np.sqrt(k) * np.finfo(np.float32).eps * (np.abs(x) @ np.abs(wv).T)
    assert np.all(np.abs(y - want) <= bound)


def _dense_case(m: int, n: int, k: int, wtype, epilogue: bool, head=O.DenseContraction):
    """head(x [m, k], w: wtype) -> [m, n], and with epilogue tanh(. + bias [n])."""
    args = [Arg(T((m, k), F32)), Arg(wtype)]
    if not epilogue:
        return case(f"{head.__name__}-{wtype.dtype}-{m}x{k}x{n}", head.__name__,
                    str(wtype.dtype), args, one(head()), exact=False)
    bias = T((n,), F32)
    body = region([T((m, n), F32), bias],
                  lambda b, h, r: b.eqn(O.Unary(O.UnaryOp.Tanh), b.eqn(
                      O.Binary(O.BinaryOp.Add), h, r)))
    return case(f"ContractionEpilogue-dense-{wtype.dtype}-{m}x{k}x{n}", "ContractionEpilogue",
                str(wtype.dtype), args + [Arg(bias)],
                one(O.ContractionEpilogue(head(), 2, body)), exact=False,
                growth="compose")


def _planned_and_checked(backend, c, seed: int):
    """The plan's one step's kernels; the case's result checked against the oracle."""
    device = backend.probe()[0]
    (step,) = plan(c.graph, (backend, device)).steps
    rng = np.random.default_rng(seed)
    inputs = draw_all(rng, c.args, c.fixed)
    (want,) = evaluate(c.graph, inputs, outputs="result")
    out = run_case(c.graph, inputs, backend, device, backend.runtime(device), rng)
    assert not out.problems
    assert mismatch(want, out.result, c.exact, c.tol) is None
    return step.lowering.program.kernels


@pytest.mark.parametrize("wtype, epilogue, head", [
    (T((40, 96), F32), False, O.DenseContraction), (T((40, 96), BF16), True, O.DenseContraction),
    (T((40, 48), U32), True, O.DenseContraction), (T((96, 40), F32), True, O.MatMul)],
    ids=["f32", "bf16-bias-tanh", "f16-words-bias-tanh", "matmul-bias-tanh"])
def test_contraction_runs_the_gemm(cpu_backend, wtype, epilogue, head):
    n = wtype.shape[1] if head is O.MatMul else wtype.shape[0]
    c = _dense_case(GEMM_FROM + 3, n, 96, wtype, epilogue, head)
    (kernel,) = _planned_and_checked(cpu_backend, c, 0)
    assert kernel.name.endswith("_gemm")


def test_few_rows_keep_the_shared_lowering(cpu_backend):
    c = _dense_case(GEMM_FROM - 1, 40, 96, T((40, 96), F32), False)
    device = cpu_backend.probe()[0]
    (step,) = plan(c.graph, (cpu_backend, device)).steps
    assert not any(k.name.endswith("_gemm") for k in step.lowering.program.kernels)


def test_epilogue_without_an_element_function_runs_after_the_gemm(cpu_backend, monkeypatch):
    """An epilogue the printer cannot fuse (a 2-D grid, for outputs past 2^24 elements) runs
    as its own kernel over the GEMM's scratch result."""
    import poot_cpu.gemv

    monkeypatch.setattr(poot_cpu.gemv, "fused_epilogue", lambda *args: None)
    cpu_backend.forget_lowerings()
    try:
        c = _dense_case(GEMM_FROM + 5, 24, 40, T((24, 40), F16), True)
        kernels = _planned_and_checked(cpu_backend, c, 2)
        assert len(kernels) == 2 and kernels[0].name.endswith("_gemm")
    finally:
        cpu_backend.forget_lowerings()
