"""Decode-shaped schedules: 16-bit GEMVs of few columns split each column's K across
warps; one-row norms take wide workgroups where the target launches them. Both against
the oracle through the kernel interpreter."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from poot.codegen.cases import _rmsnorm
from poot.codegen.interp import run_lowering
from poot.codegen.lower import dot, lower
from poot.codegen.program import CoopReduce
from poot.codegen.target import WIDE_WORKGROUPS
from poot.dtypes import DType
from poot.ir import region
from poot.ir.ops import DenseContraction, FusedRow
from poot.ir.types import TensorType as T
from poot.oracle import apply


@pytest.mark.parametrize("n, k, split", [(16, 4096, 8), (24, 1024, 2), (16, 200, 1)])
def test_few_column_gemv_splits_k_across_warps(monkeypatch, n, k, split):
    monkeypatch.setattr(dot, "SPLIT_WARPS", 256)     # the 8B's 1024 columns, scaled down
    ins = [T((1, k), DType.F32), T((n, k), DType.BF16)]
    op = DenseContraction()
    prog = lower(op, ins, op.infer(ins))
    (kernel,) = prog.kernels
    widths = {s.width for s in kernel.statements() if isinstance(s, CoopReduce)}
    assert widths == {32 * split}
    rng = np.random.default_rng(n + k)
    x = rng.standard_normal((1, k)).astype(np.float32)
    w = (rng.standard_normal((n, k)) * 0.05).astype(ml_dtypes.bfloat16)
    got = run_lowering(prog, [x, w], op.infer(ins))
    want = x @ w.astype(np.float32).T
    assert np.linalg.norm(got - want) / np.linalg.norm(want) < 1e-5


@pytest.mark.parametrize("rows, wg", [(1, 1024), (32, 256)])
def test_one_row_norm_takes_a_wide_workgroup(rows, wg):
    x, w = T((rows, 4096), DType.F32), T((4096,), DType.F32)
    op = FusedRow(region([x, w], _rmsnorm), -1)
    out = op.infer([x, w])
    prog = lower(op, [x, w], out, frozenset({WIDE_WORKGROUPS}))
    assert prog.kernels[0].workgroup == (wg,)
    assert lower(op, [x, w], out).kernels[0].workgroup == (256,)   # the portable limit
    rng = np.random.default_rng(rows)
    a = [rng.standard_normal((rows, 4096)).astype(np.float32),
         rng.standard_normal(4096).astype(np.float32)]
    want = np.asarray(apply(op, a, [x, w], out))
    np.testing.assert_allclose(run_lowering(prog, a, out), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("n, wide, dots", [(19, False, dot.ROWS_TILE), (20, True, 13 * 2)])
def test_rows_gemv_tiles_rows_over_narrow_n(monkeypatch, n, wide, dots):
    """13 rows: narrow N splits them into tiles of ROWS_TILE (the last one partial, its
    spare rows stored nowhere), wide N keeps all of them in each group of 2 columns."""
    monkeypatch.setattr(dot, "ROWS_WIDE_N", 16 if wide else 1 << 20)
    monkeypatch.setattr(dot, "ROWS_WIDE_COLUMNS", 2)
    ins = [T((13, 96), DType.F32), T((n, 96), DType.F32)]
    op = DenseContraction()
    prog = lower(op, ins, op.infer(ins))
    (kernel,) = prog.kernels
    assert sum(isinstance(s, CoopReduce) for s in kernel.statements()) == dots
    rng = np.random.default_rng(n)
    x, w = (rng.standard_normal(t.shape).astype(np.float32) for t in ins)
    got = run_lowering(prog, [x, w], op.infer(ins))
    np.testing.assert_allclose(got, x @ w.T, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("rows, n, k, split", [(13, 19, 640, 2), (32, 6, 1200, 4), (8, 5, 560, 1)])
def test_rows_gemv_splits_k_across_warps(monkeypatch, rows, n, k, split):
    """Few columns: each row tile's K is split over `split` warps (K = 1200 leaves a partial
    trip; 560 is too short to split), their sums meeting through shared memory."""
    monkeypatch.setattr(dot, "ROWS_WIDE_N", 1 << 20)
    ins = [T((rows, k), DType.F32), T((n, k), DType.F32)]
    op = DenseContraction()
    prog = lower(op, ins, op.infer(ins))
    (kernel,) = prog.kernels
    assert kernel.workgroup == (32 * dot.ROWS_GROUPS * split,)
    assert {s.width for s in kernel.statements() if isinstance(s, CoopReduce)} == {32}
    rng = np.random.default_rng(rows + n)
    x, w = (rng.standard_normal(t.shape).astype(np.float32) for t in ins)
    got = run_lowering(prog, [x, w], op.infer(ins))
    np.testing.assert_allclose(got, x @ w.T, rtol=1e-5, atol=1e-4)
