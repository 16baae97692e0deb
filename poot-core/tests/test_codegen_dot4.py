"""target.DOT4 (integer quad dot products, a target without DOT2's pair products): int8
rows take the integer GEMV, every other packed GEMV keeps the f32 schedules, and a printer
keeps the program's Dot4 while it rewrites Dot2 (`Printer.native_dot4`)."""
from __future__ import annotations

import numpy as np
import pytest
from poot.codegen.expr import Dot2, Dot4, Expr, walk
from poot.codegen.interp import run_lowering
from poot.codegen.lower import lower
from poot.codegen.lower.q8 import q8_program
from poot.codegen.printer import without_dot2
from poot.codegen.target import DOT4
from poot.conformance.cases import precision_cases
from poot.conformance.compare import mismatch
from poot.conformance.inputs import draw_all
from poot.dtypes import DType
from poot.formats import PackedWeight
from poot.ir import ops as O
from poot.ir.types import TensorType
from poot.oracle import apply

FEATURES = frozenset({DOT4})
CASES = {c.id: c for c in precision_cases() if c.key == "Q8PackedContraction"}


def _exprs(kernel):
    for s in kernel.statements():
        for v in vars(s).values():
            if isinstance(v, Expr):
                yield from walk(v)


@pytest.mark.parametrize("fmt", ["gguf:Q4_0", "gguf:Q8_0"])
def test_int8_rows_take_the_integer_gemv_and_match_the_oracle(fmt):
    case = CASES[f"Q8PackedContraction-{fmt}-1x256"]
    (eqn,) = case.graph.eqns()
    types = [case.graph.type_of(x.id) for x in eqn.inputs]
    out = case.graph.type_of(eqn.out)
    program = q8_program(eqn.op, types, out, FEATURES)
    (kernel,) = program.kernels                 # the rows quantized in its workgroups
    dots = [e for e in _exprs(kernel) if isinstance(e, Dot4)]
    assert dots and {d.b_bits for d in dots} == {4 if fmt == "gguf:Q4_0" else 8}
    arrays = draw_all(np.random.default_rng(7), case.args, case.fixed)
    want = np.asarray(apply(eqn.op, arrays, types, out)).reshape(out.shape)
    got = run_lowering(program, arrays, out)
    assert mismatch(want, got, case.exact, case.tol) is None


def test_other_packed_gemvs_keep_the_f32_schedules():
    w = PackedWeight("gguf:Q4_0", (8, 256))
    types = [TensorType((1, 256), DType.F32)] + [s.type for s in w.sources()]
    program = lower(O.PackedContraction(w), types, TensorType((1, 8), DType.F32), FEATURES)
    assert not any(isinstance(e, (Dot2, Dot4)) for k in program.kernels for e in _exprs(k))


def test_a_dot4_printer_keeps_dot4_and_lowers_the_rest():
    case = CASES["Q8PackedContraction-gguf:Q4_0-1x256"]
    (eqn,) = case.graph.eqns()
    types = [case.graph.type_of(x.id) for x in eqn.inputs]
    (kernel,) = q8_program(eqn.op, types, case.graph.type_of(eqn.out), FEATURES).kernels
    kept = without_dot2(kernel, (Dot4,))
    assert any(isinstance(e, Dot4) for e in _exprs(kept))
    assert not any(isinstance(e, Dot4) for e in _exprs(without_dot2(kernel)))
