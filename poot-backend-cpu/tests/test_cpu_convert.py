"""Casts between F32 and F16 (poot_cpu.convert) against numpy's conversions, bit for bit,
with F16C and with the plain C loop, and the builder taking the plan's casts."""
from __future__ import annotations

import ctypes

import numpy as np
import pytest
from poot.dtypes import DType
from poot.ir import ops as O
from poot.ir.types import TensorType
from poot_cpu import compiler
from poot_cpu.convert import CHUNK, cast_program
from poot_cpu.printer import HostCPrinter

F32, F16 = DType.F32, DType.F16
N = 2 * CHUNK + 13          # two whole chunks and a rest that is not a multiple of 8


def _values() -> np.ndarray:
    """Random values over f16's range, and its edges: ties, subnormals, overflow, NaN."""
    x = np.random.default_rng(0).standard_normal(N).astype(np.float32) * 100
    edges = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 65504.0, 65520.0, 1e6, 6e-8,
                      3e-8, 2.9e-8, 1e-10, 1.0 + 2.0 ** -11, 1.0 + 3 * 2.0 ** -11,
                      -(1.0 + 2.0 ** -11)], np.float32)
    x[:edges.size] = edges
    x[-edges.size:] = edges
    return x


@pytest.mark.parametrize("flags", [(), ("-mno-avx2",)], ids=["f16c", "plain-c"])
@pytest.mark.parametrize("widen", [True, False], ids=["f16-to-f32", "f32-to-f16"])
def test_casts_match_numpy_bit_for_bit(cpu_backend, widen, flags):
    src_t, dst_t = (F16, F32) if widen else (F32, F16)
    op = O.Cast(dst_t)
    prog = cast_program(op, [TensorType((N,), src_t)], TensorType((N,), dst_t), HostCPrinter())
    (kernel,) = prog.kernels
    lib = compiler.load(HostCPrinter().prelude(simd=True) + kernel.source + (
        f"void run(const void* a, void* b) {{\n  #pragma omp parallel\n"
        f"  {kernel.name}(a, b);\n}}\n"), compiler.FLAGS + flags)
    lib.run.argtypes = [ctypes.c_void_p] * 2
    x = _values()
    with np.errstate(over="ignore"):
        x = x.astype(np.float16) if widen else x
        want = x.astype(np.float32 if widen else np.float16)
    got = np.empty_like(want)
    lib.run(x.ctypes.data, got.ctypes.data)
    nan = np.isnan(want)
    assert np.array_equal(np.isnan(got), nan)
    assert np.array_equal(got[~nan].view(np.uint32 if widen else np.uint16),
                          want[~nan].view(np.uint32 if widen else np.uint16))


def test_only_f16_f32_casts_of_one_shape_are_taken():
    p = HostCPrinter()
    t = TensorType
    assert cast_program(O.Cast(F32), [t((4,), F16)], t((4,), F32), p) is not None
    assert cast_program(O.Cast(F32), [t((4,), DType.BF16)], t((4,), F32), p) is None
    assert cast_program(O.Cast(DType.I32), [t((4,), F32)], t((4,), DType.I32), p) is None
    assert cast_program(O.Cast(F16), [t((4,), F16)], t((4,), F16), p) is None
