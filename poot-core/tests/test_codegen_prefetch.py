"""Prefetch: the GEMV's weight prefetch for targets that declare PREFETCH, its rules
(leading statements only, ranges in bounds) and the results it leaves unchanged."""
from __future__ import annotations

import zlib

import numpy as np
import pytest
from poot.codegen.builder import KernelBuilder
from poot.codegen.cases import all_cases, mismatch
from poot.codegen.expr import Const
from poot.codegen.interp import KernelFault, run, run_lowering
from poot.codegen.lower import lower
from poot.codegen.program import Access, Prefetch, leading_prefetches, local_index
from poot.codegen.target import PREFETCH
from poot.dtypes import DType
from poot.errors import IRError
from poot.ir.ops import ContractionEpilogue, DenseContraction, PackedContraction
from poot.oracle import apply

CASES = [c for c in all_cases()
         if isinstance(c.op, (DenseContraction, PackedContraction, ContractionEpilogue))
         and c.id in ("dense-(1,)-20x64-bf16", "dense-(3,)-17x63-f32", "dense-(1,)-12x2088-bf16",
                      "epilogue-dense-bias-residual", "packed-gguf:Q4_0-m1",
                      "packed-gguf:Q4_K-m1", "packed-dense:f16words-m1")]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_gemv_prefetch_leads_and_keeps_results(case):
    out = case.out()
    arrays = case.make(np.random.default_rng(zlib.crc32(case.id.encode())))
    args = [np.asarray(x.value, x.dtype.numpy) if a is None else a
            for a, x in zip(arrays, case.ins, strict=True)]
    want = np.asarray(apply(case.op, args, case.types(), out)).reshape(out.shape)
    lowering = lower(case.op, case.ins, out, frozenset({PREFETCH}))
    (kernel,) = lowering.kernels
    lead = leading_prefetches(kernel.body)
    assert lead, f"{case.id}: the GEMV prefetches none of its weight rows"
    assert all(p.src != "in0" for p in lead)           # weights, never the activations
    got = run_lowering(lowering, arrays, out)           # the interpreter checks the ranges
    assert mismatch(got, want, case.tol) is None
    plain = lower(case.op, case.ins, out)
    assert not leading_prefetches(plain.kernels[0].body)   # only where the target has it


def _kernel(body_first: bool, index: int = 0, count: int = 4):
    kb = KernelBuilder("k", (1,), (32,))
    kb.buffer("w", DType.F32, Access.READ, 16)
    kb.buffer("out", DType.F32, Access.WRITE, 32)
    if body_first:
        kb.prefetch("w", index, count)
    kb.store("out", local_index(), Const(1.0, DType.F32))
    if not body_first:
        kb.prefetch("w", index, count)
    return kb.finish()


def test_prefetch_must_lead_the_body():
    assert isinstance(_kernel(True).body[0], Prefetch)
    with pytest.raises(IRError, match="must lead"):
        _kernel(False)


def test_interpreter_refuses_a_prefetch_out_of_range():

    buffers = {"w": np.zeros(16, np.float32), "out": np.zeros(32, np.float32)}
    run(_kernel(True, 12, 4), buffers)
    with pytest.raises(KernelFault, match="prefetch of"):
        run(_kernel(True, 14, 4), buffers)
