"""Concat (poot_cpu.concat) against numpy, byte for byte: a first, middle and last axis,
runs over and under a chunk, several dtypes (the conformance suite runs the plan's Concat
cases against the oracle)."""
from __future__ import annotations

import ctypes

import numpy as np
import pytest
from poot.dtypes import DType
from poot.ir import ops as O
from poot.ir.types import TensorType
from poot_cpu import compiler
from poot_cpu.concat import CHUNK, concat_program
from poot_cpu.printer import HostCPrinter

CASES = [
    # (shapes, axis, dtype): a KV ring and its new row; runs longer than a chunk; a middle
    # axis; the last axis; an operand of extent 0; three operands; bytes
    ([(256, 1, 256), (1, 1, 256)], 0, DType.F32),
    ([(3, CHUNK // 4 + 5, 2), (3, 7, 2)], 1, DType.F32),
    ([(2, 3, 5), (2, 4, 5), (2, 1, 5)], 1, DType.I32),
    ([(4, 3), (4, 9)], -1, DType.F16),
    ([(2, 0, 3), (2, 5, 3)], 1, DType.F32),
    ([(5,), (1,), (7,)], 0, DType.U8),
]
NP = {DType.F32: np.float32, DType.I32: np.int32, DType.F16: np.float16, DType.U8: np.uint8}


@pytest.mark.parametrize("shapes, axis, dtype", CASES)
def test_concat_matches_numpy(cpu_backend, shapes, axis, dtype):
    rng = np.random.default_rng(0)
    xs = [(rng.standard_normal(s) * 50).astype(NP[dtype]) for s in shapes]
    want = np.concatenate(xs, axis=axis)
    op = O.Concat(axis)
    ins = [TensorType(s, dtype) for s in shapes]
    prog = concat_program(op, ins, op.infer(ins), HostCPrinter())
    if any(x.size == 0 for x in xs):
        assert prog is None      # the shared lowering takes an empty operand
        return
    (kernel,) = prog.kernels
    args = ", ".join(f"a[{j}]" for j in range(len(xs)))
    lib = compiler.load(HostCPrinter().prelude() + kernel.source + (
        f"void run(void** a, void* out) {{\n  #pragma omp parallel\n"
        f"  {kernel.name}({args}, out);\n}}\n"))
    lib.run.argtypes = [ctypes.c_void_p] * 2
    ptrs = (ctypes.c_void_p * len(xs))(*(x.ctypes.data for x in xs))
    got = np.zeros_like(want)
    lib.run(ctypes.cast(ptrs, ctypes.c_void_p), got.ctypes.data)
    assert np.array_equal(got.view(np.uint8), want.view(np.uint8))
