"""Decode-shaped schedules: 16-bit GEMVs of few columns split each column's K across
warps; one-row norms take wide workgroups where the target launches them; the rows GEMV
finishes its dot products by reduce-scatter where the target has it. All against the
oracle (or numpy) through the kernel interpreter."""
from __future__ import annotations

from dataclasses import replace

import ml_dtypes
import numpy as np
import pytest
from poot.codegen.cases import _rmsnorm
from poot.codegen.interp import run_lowering
from poot.codegen.lower import lower
from poot.codegen.lower.schedule import ROWS_FOLDED, DotSchedule, dot_schedule
from poot.codegen.program import CoopReduce, CoopReduceScatter, LoadWide
from poot.codegen.target import REDUCE_SCATTER, WIDE_LOADS, WIDE_WORKGROUPS
from poot.dtypes import DType
from poot.ir import region
from poot.ir.ops import DenseContraction, FusedRow, NormedDenseContraction
from poot.ir.types import TensorType as T
from poot.oracle import apply


def _tuned(features: frozenset = frozenset(), **fields) -> DotSchedule:
    """The target's default schedule with `fields` replaced."""
    return replace(dot_schedule(features), **fields)


def _matches_numpy(prog, op, ins):
    """The 16-bit GEMV `prog` of x [M, K] against w [N, K] gives numpy's x @ w^T."""
    (m, k), (n, _) = ins[0].shape, ins[1].shape
    rng = np.random.default_rng(n + k)
    x = rng.standard_normal((m, k)).astype(np.float32)
    w = (rng.standard_normal((n, k)) * 0.05).astype(ml_dtypes.bfloat16)
    got = run_lowering(prog, [x, w], op.infer(ins))
    want = x @ w.astype(np.float32).T
    assert np.linalg.norm(got - want) / np.linalg.norm(want) < 1e-5


@pytest.mark.parametrize("n, k, split", [(16, 4096, 8), (24, 1024, 2), (16, 200, 1)])
def test_few_column_gemv_splits_k_across_warps(n, k, split):
    ins = [T((1, k), DType.F32), T((n, k), DType.BF16)]
    op = DenseContraction()
    # the 8B's 1024 columns, scaled down
    prog = lower(op, ins, op.infer(ins), schedule=_tuned(split_warps=256))
    (kernel,) = prog.kernels
    widths = {s.width for s in kernel.statements() if isinstance(s, CoopReduce)}
    assert widths == {32 * split}
    _matches_numpy(prog, op, ins)


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


@pytest.mark.parametrize("n, wide, dots", [(19, False, ROWS_FOLDED.tile), (20, True, 13 * 2)])
def test_rows_gemv_tiles_rows_over_narrow_n(n, wide, dots):
    """13 rows: narrow N splits them into tiles of ROWS_FOLDED.tile (the last one partial, its
    spare rows stored nowhere), wide N keeps all of them in each group of 2 columns."""
    schedule = _tuned(rows_wide_n=16 if wide else 1 << 20, rows_wide_columns=2)
    ins = [T((13, 96), DType.F32), T((n, 96), DType.F32)]
    op = DenseContraction()
    prog = lower(op, ins, op.infer(ins), schedule=schedule)
    (kernel,) = prog.kernels
    assert sum(isinstance(s, CoopReduce) for s in kernel.statements()) == dots
    rng = np.random.default_rng(n)
    x, w = (rng.standard_normal(t.shape).astype(np.float32) for t in ins)
    got = run_lowering(prog, [x, w], op.infer(ins))
    np.testing.assert_allclose(got, x @ w.T, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("rows, n, k, split", [(13, 19, 640, 2), (32, 6, 1200, 4), (8, 5, 560, 1)])
def test_rows_gemv_splits_k_across_warps(rows, n, k, split):
    """Few columns: each row tile's K is split over `split` warps (K = 1200 leaves a partial
    trip; 560 is too short to split), their sums meeting through shared memory."""
    schedule = _tuned(rows_wide_n=1 << 20)
    ins = [T((rows, k), DType.F32), T((n, k), DType.F32)]
    op = DenseContraction()
    prog = lower(op, ins, op.infer(ins), schedule=schedule)
    (kernel,) = prog.kernels
    assert kernel.workgroup == (32 * schedule.rows_groups * split,)
    assert {s.width for s in kernel.statements() if isinstance(s, CoopReduce)} == {32}
    rng = np.random.default_rng(rows + n)
    x, w = (rng.standard_normal(t.shape).astype(np.float32) for t in ins)
    got = run_lowering(prog, [x, w], op.infer(ins))
    np.testing.assert_allclose(got, x @ w.T, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("rows, n, k, wide, sets", [
    (32, 256, 320, False, [32, 32]),  # 4 columns x 16 rows a group, K over 2 warps
    (24, 256, 320, False, [32, 32]),  # the second row tile half spare
    (32, 8, 640, False, [16]),        # too few groups for 4 columns: one, K over 8 warps
    (13, 19, 1200, False, [16]),      # one tile of 13 rows (padded to 16), 8 warps
    (5, 16, 64, False, [8]),          # 5 of 8 products real
    (32, 24, 96, True, [32, 32]),     # wide: 2 columns x 32 rows, two sets of 32
])
def test_rows_gemv_reduce_scatters_its_dot_products(rows, n, k, wide, sets):
    """With REDUCE_SCATTER the rows GEMV reduces a group's products 32 at a time, each
    thread storing the one it holds (through shared memory when K is split over warps);
    the values match numpy in every layout of tiles, columns and spare rows."""
    features = frozenset({REDUCE_SCATTER})
    schedule = _tuned(features, rows_wide_n=16 if wide else 1 << 20)
    ins = [T((rows, k), DType.F32), T((n, k), DType.F32)]
    op = DenseContraction()
    prog = lower(op, ins, op.infer(ins), features, schedule)
    (kernel,) = prog.kernels
    assert [len(s.values) for s in kernel.statements()
            if isinstance(s, CoopReduceScatter)] == sets
    assert not any(isinstance(s, CoopReduce) for s in kernel.statements())
    rng = np.random.default_rng(rows * n)
    x, w = (rng.standard_normal(t.shape).astype(np.float32) for t in ins)
    got = run_lowering(prog, [x, w], op.infer(ins))
    np.testing.assert_allclose(got, x @ w.T, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("m, n, k, sets, split", [
    (32, 576, 576, [32, 32], 2), (32, 192, 576, [16], 8), (32, 576, 1536, [32, 32], 2),
    (16, 576, 576, [16], 8), (16, 1536, 576, [16], 4), (8, 1536, 576, [8], 4),
])
def test_scattered_rows_plan_on_smollm2_shapes(m, n, k, sets, split):
    """Products per group (columns x rows) and K split under ROWS_SCATTERED at SmolLM2's
    decode shapes: the tiles the H200 sweep found best (docs/performance.md, 2026-12-03):
    4 columns x 16 rows past 16 rows where N leaves groups enough, else one column of
    all rows; K over the most warps that keep a workgroup's accumulators in registers."""
    features = frozenset({REDUCE_SCATTER})
    ins = [T((m, k), DType.F32), T((n, k), DType.F32)]
    op = DenseContraction()
    (kernel,) = lower(op, ins, op.infer(ins), features).kernels
    assert [len(s.values) for s in kernel.statements()
            if isinstance(s, CoopReduceScatter)] == sets
    assert kernel.workgroup == (32 * dot_schedule(features).rows_groups * split,)


@pytest.mark.parametrize("m, n, k, split", [(1, 16, 4096, 8), (2, 24, 1040, 2), (1, 19, 200, 1)])
@pytest.mark.parametrize("wide, pairs", [(False, True), (True, True), (True, False)],
                         ids=["narrow", "wide", "wide-no-pairs"])
def test_16_bit_gemv_takes_the_norm_in(m, n, k, split, wide, pairs):
    """NormedDenseContraction: one kernel, each group summing x^2 over the K it walks
    (split across warps or not); with WIDE_LOADS (and DotSchedule.pairs) each word's two
    activations and two norm weights come in one 8-byte load each. Same as the oracle's
    norm, then GEMV."""
    features = frozenset({WIDE_LOADS}) if wide else frozenset()
    ins = [T((m, k), DType.F32), T((n, k), DType.BF16), T((k,), DType.F32)]
    op = NormedDenseContraction(1e-5)
    out = op.infer(ins)
    prog = lower(op, ins, out, features, _tuned(features, split_warps=256, pairs=pairs))
    (kernel,) = prog.kernels
    loads = [s for s in kernel.statements() if isinstance(s, LoadWide)]
    assert bool(loads) == (wide and pairs) and all(len(s.names) == 2 for s in loads)
    assert {s.width for s in kernel.statements() if isinstance(s, CoopReduce)} == {32 * split}
    rng = np.random.default_rng(k)
    a = [rng.standard_normal((m, k)).astype(np.float32),
         (rng.standard_normal((n, k)) * 0.05).astype(ml_dtypes.bfloat16),
         rng.standard_normal(k).astype(np.float32)]
    want = np.asarray(apply(op, a, ins, out))
    np.testing.assert_allclose(run_lowering(prog, a, out), want, rtol=1e-4, atol=1e-5)


def test_a_schedule_apart_from_the_default_names_its_kernels_apart():
    """The target's default schedule passed explicitly lowers the kernels it lowers by
    default, under the same names; another is named apart (caches keyed by name never
    mix the two), but only where the lowering reads it: a norm's kernel stays as it is."""
    features = frozenset({REDUCE_SCATTER, WIDE_LOADS})
    other = _tuned(features, unroll=2)
    ins = [T((1, 4096), DType.F32), T((24, 4096), DType.BF16)]
    op = DenseContraction()
    plain = lower(op, ins, op.infer(ins), features)
    same = lower(op, ins, op.infer(ins), features, dot_schedule(features))
    assert repr(same.kernels) == repr(plain.kernels)
    assert lower(op, ins, op.infer(ins), features, other).kernels[0].name != \
        plain.kernels[0].name
    x, w = T((1, 4096), DType.F32), T((4096,), DType.F32)
    norm = FusedRow(region([x, w], _rmsnorm), -1)
    assert repr(lower(norm, [x, w], norm.infer([x, w]), features, other).kernels) == \
        repr(lower(norm, [x, w], norm.infer([x, w]), features).kernels)


@pytest.mark.parametrize("early", [True, False])
def test_gemv_loads_its_first_weights_before_the_wait(early):
    """DotSchedule.early_loads: the 16-bit GEMV issues its first trip's weight loads (and
    only those: operand 1) before AwaitInputs; without it the kernel waits at entry. The
    sums are the same either way."""
    ins = [T((2, 4096), DType.F32), T((24, 4096), DType.BF16)]
    op = DenseContraction()
    prog = lower(op, ins, op.infer(ins), schedule=_tuned(early_loads=early))
    (kernel,) = prog.kernels
    assert kernel.early_reads() == (frozenset({1}) if early else None)
    _matches_numpy(prog, op, ins)


@pytest.mark.parametrize("s, live, kernels", [(1024, 101, 1), (1024, 1024, 1), (2048, 1999, 2)])
def test_decode_attention_takes_wide_workgroups(s, live, kernels):
    """WIDE_WORKGROUPS: a decode row's keys up to 1024 go to one workgroup of DECODE_WARPS
    groups (no merge kernel); more split across workgroups and merge. Against the oracle."""
    from poot.codegen.lower import attention
    from poot.ir.ops import Attention

    q, kv, m = T((1, 4, 1, 64), DType.F32), T((1, 2, s, 64), DType.F32), T((1, 1, 1, s), DType.F32)
    op, ins = Attention(0.125), [q, kv, kv, m]
    out = op.infer(ins)
    prog = lower(op, ins, out, frozenset({WIDE_WORKGROUPS}))
    assert len(prog.kernels) == kernels
    assert prog.kernels[0].workgroup == (32 * attention.DECODE_WARPS,)
    rng = np.random.default_rng(s)
    mask = np.where(np.arange(s) < live, 0.0, -np.inf).astype(np.float32).reshape(m.shape)
    a = [rng.standard_normal(x.shape).astype(np.float32) for x in (q, kv, kv)] + [mask]
    want = np.asarray(apply(op, a, ins, out))
    np.testing.assert_allclose(run_lowering(prog, a, out), want, rtol=1e-5, atol=1e-6)
