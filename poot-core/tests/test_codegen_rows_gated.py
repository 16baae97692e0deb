"""A GatedContraction of a few rows more than the GEMV holds takes the rows GEMV, whose
workgroups join each pair of columns (i, N/2 + i) of every row: one kernel, in every
layout of row tiles, columns a group, K split over warps and reduce-scatter, against the
oracle through the kernel interpreter. Where a workgroup's row tiles would not make whole
columns, or the rows are past the rows GEMV's batch, the halves are joined after the
contraction (two kernels)."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from poot.codegen.cases import GATED_TOL, mismatch, silu_mul
from poot.codegen.interp import run_lowering
from poot.codegen.lower import lower
from poot.codegen.lower.schedule import dot_schedule
from poot.codegen.program import CoopReduceScatter
from poot.codegen.target import REDUCE_SCATTER
from poot.dtypes import DType
from poot.formats import PackedWeight, formats
from poot.ir import region
from poot.ir.ops import DenseContraction, GatedContraction, PackedContraction
from poot.ir.types import TensorType as T
from poot.oracle import apply

F32 = DType.F32
SCATTER = frozenset({REDUCE_SCATTER})
FOLDED = frozenset()


def _gated(head, rows: int, n: int, weight: list) -> GatedContraction:
    half = T((rows, n // 2), F32)
    return GatedContraction(head, 1 + len(weight), region([half, half], silu_mul))


def _check(op, ins, arrays, features, schedule=None, kernels=1):
    out = op.infer(ins)
    prog = lower(op, ins, out, features, schedule or dot_schedule(features))
    assert len(prog.kernels) == kernels, [k.name for k in prog.kernels]
    if kernels == 1:      # the rows GEMV: its products scattered where the target can
        (kernel,) = prog.kernels
        assert [a.name for a in kernel.shared if a.name == "pair_sums"] == ["pair_sums"]
        scattered = any(isinstance(s, CoopReduceScatter) for s in kernel.statements())
        assert scattered == (REDUCE_SCATTER in features)
    want = np.asarray(apply(op, arrays, ins, out))
    problem = mismatch(run_lowering(prog, arrays, out), want, GATED_TOL)
    assert problem is None, problem
    return prog


@pytest.mark.parametrize("features, rows, n, k, wide", [
    (SCATTER, 8, 64, 96, False),       # one tile of all rows, one column a group
    (SCATTER, 13, 40, 640, False),     # one tile padded (spare rows), K split over warps
    (SCATTER, 24, 512, 320, False),    # two row tiles, the second half spare, 4 columns
    (SCATTER, 32, 48, 96, True),       # wide: 2 columns a group, every row
    (FOLDED, 8, 64, 96, False),        # each product by its own butterfly
    (FOLDED, 16, 512, 320, False),     # two row tiles of 8, 4 columns a group
    (FOLDED, 13, 40, 640, False),      # a partial second tile, K split over warps
], ids=["s8", "s13-split", "s24-tiles", "s32-wide", "f8", "f16-tiles", "f13-split"])
def test_rows_gemv_joins_its_pairs(features, rows, n, k, wide):
    schedule = replace(dot_schedule(features), rows_wide_n=16 if wide else 1 << 20)
    w = T((n, k), F32)
    op = _gated(DenseContraction(), rows, n, [w])
    ins = [T((rows, k), F32), w]
    rng = np.random.default_rng(rows * n + k)
    arrays = [rng.standard_normal(t.shape).astype(np.float32) for t in ins]
    _check(op, ins, arrays, features, schedule)


@pytest.mark.parametrize("rows", [8, 32])
def test_packed_gate_up_of_a_verification(rows):
    """A Q4_0 gate|up of SmolLM2's K, narrow: the shape of a speculative verification's
    (8 rows) and a prefill chunk's (32) FFN, scattered as on CUDA."""
    pw = PackedWeight("gguf:Q4_0", (256, 576))
    fmt = formats()["gguf:Q4_0"]
    rng = np.random.default_rng(rows)
    srcs = [np.asarray(s) for s in fmt.quantize(rng.standard_normal(pw.shape)
                                                .astype(np.float32))]
    src_types = [s.type for s in pw.sources()]
    op = _gated(PackedContraction(pw), rows, 256, src_types)
    ins = [T((rows, 576), F32), *src_types]
    _check(op, ins, [rng.standard_normal((rows, 576)).astype(np.float32), *srcs], SCATTER)


@pytest.mark.parametrize("features, rows", [
    (SCATTER, dot_schedule(SCATTER).batch_rows + 8),  # past the rows GEMV: the tiled GEMM
    (FOLDED, 24),      # three row tiles of 8 over a workgroup's 4 groups: columns split
], ids=["past-batch", "tiles-across-workgroups"])
def test_elsewhere_the_halves_join_after(features, rows):
    w = T((512, 64), F32)
    op = _gated(DenseContraction(), rows, 512, [w])
    ins = [T((rows, 64), F32), w]
    rng = np.random.default_rng(rows)
    arrays = [rng.standard_normal(t.shape).astype(np.float32) for t in ins]
    _check(op, ins, arrays, features, replace(dot_schedule(features), rows_wide_n=1 << 20),
           kernels=2)
