"""The tensor-core GEMM schedule (MmaTile + CopyAsync), run by the kernel interpreter
against the oracle; and where it must not be chosen."""
from __future__ import annotations

import numpy as np
import pytest
from poot.codegen import index as ix
from poot.codegen.builder import KernelBuilder
from poot.codegen.cases import mismatch
from poot.codegen.interp import run, run_lowering
from poot.codegen.lower import lower, mma
from poot.codegen.program import OUT, Access, MmaTile, Store, StoreWide, group_id
from poot.codegen.target import COPY_ASYNC, FEATURES, MMA_M16N8K16, TMA, WGMMA, WIDE_LOADS
from poot.dtypes import DType
from poot.ir.ops import MatMul
from poot.ir.types import TensorType
from poot.oracle import apply

MMA = MMA_M16N8K16.feature
#: an sm_80-class target: the warpgroup schedule (WGMMA, TMA) would win, and it is not
#: interpreted (tests/test_codegen_wgmma.py)
FEATURES = FEATURES - {WGMMA, TMA}

BF16, F16, F32 = DType.BF16, DType.F16, DType.F32


def uses_mma(lowering) -> bool:
    return any(isinstance(s, MmaTile) for k in lowering.kernels for s in k.statements())


@pytest.mark.parametrize("a_shape,w_shape,dt", [
    ((64, 32), (32, 128), BF16),            # one tile, one K step
    ((130, 48), (48, 136), F16),            # ragged M and N edges, K past one step
    ((200, 72), (72, 24), BF16),            # N smaller than a warp's columns
    ((2, 3, 64, 16), (3, 16, 40), BF16),    # broadcast batch axes
])
def test_tensor_core_matmul_matches_oracle(a_shape, w_shape, dt):
    rng = np.random.default_rng(sum(a_shape) + sum(w_shape))
    a, w = TensorType(a_shape, dt), TensorType(w_shape, dt)
    out = MatMul().infer([a, w])
    lowering = lower(MatMul(), [a, w], out, FEATURES)
    assert uses_mma(lowering)
    x = rng.standard_normal(a_shape).astype(dt.numpy)
    y = rng.standard_normal(w_shape).astype(dt.numpy)
    want = np.asarray(apply(MatMul(), [x, y], [a, w], out)).reshape(out.shape)
    got = run_lowering(lowering, [x, y], out)
    assert mismatch(got, want, 1e-5) is None


@pytest.mark.parametrize("wide", [True, False], ids=["pairs", "single"])
def test_each_lane_stores_its_column_pairs_at_once_with_wide_loads(wide):
    """Each row's two neighbouring outputs of a lane in one StoreWide where the target has
    WIDE_LOADS (ragged M and N edges skipped whole pairs), one Store each without."""
    features = FEATURES if wide else FEATURES - {WIDE_LOADS}
    a, w = TensorType((130, 48), BF16), TensorType((48, 136), BF16)
    out = MatMul().infer([a, w])
    lowering = lower(MatMul(), [a, w], out, features)
    stores = [type(s) for k in lowering.kernels for s in k.statements()
              if isinstance(s, (Store, StoreWide)) and s.array == "out"]
    assert set(stores) == {StoreWide if wide else Store}
    rng = np.random.default_rng(7)
    x = rng.standard_normal(a.shape).astype(BF16.numpy)
    y = rng.standard_normal(w.shape).astype(BF16.numpy)
    want = np.asarray(apply(MatMul(), [x, y], [a, w], out)).reshape(out.shape)
    assert mismatch(run_lowering(lowering, [x, y], out), want, 1e-5) is None


@pytest.mark.parametrize("features,a_shape,w_shape,dt", [
    (frozenset(), (128, 32), (32, 128), BF16),          # target without matrix units
    (frozenset({MMA}), (128, 32), (32, 128), BF16),     # no async copies
    (FEATURES, (128, 32), (32, 128), F32),              # not 16-bit operands
    (FEATURES, (128, 36), (36, 128), BF16),             # K not in whole 16-byte chunks
    (FEATURES, (32, 32), (32, 128), BF16),              # too few rows for the tile
])
def test_fma_schedule_where_tensor_cores_do_not_fit(features, a_shape, w_shape, dt):
    a, w = TensorType(a_shape, dt), TensorType(w_shape, dt)
    assert not uses_mma(lower(MatMul(), [a, w], MatMul().infer([a, w]), features))


def test_unknown_features_are_refused():
    from poot.errors import UnsupportedOp

    a = TensorType((4, 8), F32)
    with pytest.raises(UnsupportedOp, match="unknown kernel features"):
        lower(MatMul(), [a, TensorType((8, 4), F32)], TensorType((4, 4), F32),
              frozenset({COPY_ASYNC, "warp.specialize"}))


@pytest.mark.parametrize("schedule", [
    dict(stages=2), dict(stages=3, bk=64), dict(bn=256, warps_n=4), dict(bm=64, warps_m=1),
    dict(bm=32, warps_m=1, bn=64, band=2),     # 3 x 5 tiles in bands of 2 rows: a ragged band
], ids=str)
def test_other_schedules_match_oracle(monkeypatch, schedule):
    """Every shape of the schedule (stages, K step, tile, warp grid) computes the same."""

    monkeypatch.setattr(mma, "SCHEDULE", mma.Schedule(**schedule))
    rng = np.random.default_rng(7)
    a, w = TensorType((96, 200), BF16), TensorType((200, 264), BF16)
    out = MatMul().infer([a, w])
    lowering = lower(MatMul(), [a, w], out, FEATURES)
    assert uses_mma(lowering)
    x = rng.standard_normal(a.shape).astype(BF16.numpy)
    y = rng.standard_normal(w.shape).astype(BF16.numpy)
    want = np.asarray(apply(MatMul(), [x, y], [a, w], out)).reshape(out.shape)
    assert mismatch(run_lowering(lowering, [x, y], out), want, 1e-5) is None


def test_an_epilogue_keeps_the_tensor_core_schedule():
    """ContractionEpilogue(MatMul) lowers its head with the target's features too: the
    epilogue (here + bias) runs on the accumulators the MmaTiles left."""
    from poot.ir import region
    from poot.ir.ops import Binary, BinaryOp, ContractionEpilogue

    rng = np.random.default_rng(3)
    a, w, bias = TensorType((96, 40), BF16), TensorType((40, 72), BF16), TensorType((72,), BF16)
    body = region([TensorType((96, 72), BF16), bias],
                  lambda b, h, bb: b.eqn(Binary(BinaryOp.Add), h, bb))
    op = ContractionEpilogue(MatMul(), 2, body)
    out = op.infer([a, w, bias])
    lowering = lower(op, [a, w, bias], out, FEATURES)
    assert uses_mma(lowering)
    args = [rng.standard_normal(t.shape).astype(BF16.numpy) for t in (a, w, bias)]
    want = np.asarray(apply(op, args, [a, w, bias], out)).reshape(out.shape)
    assert mismatch(run_lowering(lowering, args, out), want, 1e-5) is None


# -- split operands: F32 activations, packed or 16-bit weights (mma_operands.SplitTiles) --
def _packed(fmt: str, m: int, n: int, k: int, seed: int):
    from poot.formats import PackedWeight, get_format
    from poot.ir.ops import PackedContraction

    rng = np.random.default_rng(seed)
    pw = PackedWeight(fmt, (n, k))
    ins = [TensorType((m, k), F32), *[s.type for s in pw.sources()]]
    op = PackedContraction(pw)
    srcs = [np.asarray(s) for s in get_format(fmt).quantize(
        rng.standard_normal((n, k)).astype(np.float32))]
    dense = np.asarray(pw.dequantize(srcs), np.float64).reshape(n, k)
    return op, ins, [rng.standard_normal((m, k)).astype(np.float32), *srcs], dense


def _nmse(got, want) -> float:
    return float(np.sum((got - want) ** 2) / np.sum(want ** 2))


@pytest.mark.parametrize("fmt,m,n,k", [
    ("gguf:Q4_1", 40, 40, 96),      # SmolLM2's format; N past one tile, K short of one step
    ("gguf:Q4_0", 48, 24, 320),     # runs of 64: pairs; a partial K step
    ("gguf:Q8_0", 36, 16, 256),
    ("fp8:e4m3", 100, 16, 64),      # no runs (decode_expr pairs); two row tiles
])
def test_packed_contraction_on_split_tensor_cores(fmt, m, n, k):
    """Decode batches and prefill chunks of packed weights take the tensor cores on a
    target with them, within the contractions' conformance bound (NMSE 3.7e-9)."""
    from poot.codegen.cases import INT_GEMV_TOL

    op, ins, args, dense = _packed(fmt, m, n, k, m + n + k)
    out = op.infer(ins)
    lowering = lower(op, ins, out, FEATURES)
    assert uses_mma(lowering)
    got = run_lowering(lowering, args, out)
    assert _nmse(got, args[0].astype(np.float64) @ dense.T) < INT_GEMV_TOL / 100


def test_packed_epilogue_keeps_the_split_schedule():
    """ContractionEpilogue over a packed head: the epilogue (+ bias) on the accumulators."""
    from poot.ir import region
    from poot.ir.ops import Binary, BinaryOp, ContractionEpilogue

    head, ins, args, dense = _packed("gguf:Q4_1", 40, 24, 128, 5)
    bias = TensorType((24,), F32)
    body = region([TensorType((40, 24), F32), bias],
                  lambda b, h, bb: b.eqn(Binary(BinaryOp.Add), h, bb))
    op = ContractionEpilogue(head, len(ins), body)
    out = op.infer([*ins, bias])
    lowering = lower(op, [*ins, bias], out, FEATURES)
    assert uses_mma(lowering)
    bv = np.random.default_rng(9).standard_normal(24).astype(np.float32)
    got = run_lowering(lowering, [*args, bv], out)
    assert _nmse(got, args[0].astype(np.float64) @ dense.T + bv) < 1e-10


@pytest.mark.parametrize("wdt", [BF16, F16])
def test_16_bit_weight_with_f32_activations_on_split_tensor_cores(wdt):
    from poot.ir.ops import DenseContraction

    rng = np.random.default_rng(4)
    ins = [TensorType((2, 20, 200), F32), TensorType((24, 200), wdt)]
    op = DenseContraction()
    out = op.infer(ins)
    lowering = lower(op, ins, out, FEATURES)
    assert uses_mma(lowering)
    x = rng.standard_normal((2, 20, 200)).astype(np.float32)
    w = rng.standard_normal((24, 200)).astype(wdt.numpy)
    got = run_lowering(lowering, [x, w], out)
    assert _nmse(got, x.astype(np.float64) @ w.astype(np.float64).T) < 1e-10


@pytest.mark.parametrize("features,m,wdt", [
    (frozenset({COPY_ASYNC}), 40, None),     # a target without matrix units (every non-cuda)
    (FEATURES, 32, None),                    # a decode batch over narrow N: the rows GEMV
    (FEATURES, 40, F32),                     # f32 weights do not split exactly
])
def test_fma_schedules_where_split_tensor_cores_do_not_fit(features, m, wdt):
    from poot.ir.ops import DenseContraction

    if wdt is None:
        op, ins, _, _ = _packed("gguf:Q4_1", m, 32, 64, 0)
    else:
        op, ins = DenseContraction(), [TensorType((m, 64), F32), TensorType((32, 64), wdt)]
    assert not uses_mma(lower(op, ins, op.infer(ins), features))


@pytest.mark.parametrize("schedule", [
    dict(bm=32, bn=32, bk=128, warps_m=1, warps_n=1, warps_k=8),    # runs < threads: pairs
    dict(bm=16, bn=16, bk=256, warps_m=1, warps_n=1, warps_k=16),
    dict(bm=32, bn=64, bk=64, warps_m=1, warps_n=2, warps_k=2),
    dict(bm=16, bn=16, bk=128, warps_m=1, warps_n=1, warps_k=4, band=2),   # ragged band
], ids=str)
def test_other_split_schedules_match_numpy(monkeypatch, schedule):
    from poot.codegen.cases import INT_GEMV_TOL

    monkeypatch.setattr(mma, "DECODE", mma.Schedule(**schedule))
    op, ins, args, dense = _packed("gguf:Q4_1", 40, 40, 320, 2)
    out = op.infer(ins)
    lowering = lower(op, ins, out, FEATURES)
    assert uses_mma(lowering)
    got = run_lowering(lowering, args, out)
    assert _nmse(got, args[0].astype(np.float64) @ dense.T) < INT_GEMV_TOL / 100


@pytest.mark.parametrize("m", [16, 32])
def test_wide_n_takes_split_tensor_cores_from_16_rows(monkeypatch, m):
    """A head's many columns (here 72 past a lowered SPLIT_WIDE_N) at a decode batch."""
    from poot.codegen.cases import INT_GEMV_TOL

    monkeypatch.setattr(mma, "SPLIT_WIDE_N", 64)
    op, ins, args, dense = _packed("gguf:Q4_1", m, 72, 128, m)
    out = op.infer(ins)
    lowering = lower(op, ins, out, FEATURES)
    assert uses_mma(lowering)
    got = run_lowering(lowering, args, out)
    assert _nmse(got, args[0].astype(np.float64) @ dense.T) < INT_GEMV_TOL / 100


def launch_order(tiles_n: int, tiles_m: int, band: int) -> list[tuple[int, int]]:
    """The (tile row, tile column) of each workgroup, in launch order (x fastest)."""
    kb = KernelBuilder("order", (tiles_n, tiles_m), (1,))
    kb.buffer("out", DType.I32, Access.WRITE, 2 * tiles_n * tiles_m, operand=OUT)
    tm, tn = mma.tile_order(kb, tiles_n, tiles_m, band)
    slot = ix.mul(ix.add(group_id(0), ix.mul(group_id(1), tiles_n)), 2)
    kb.store("out", slot, tm)
    kb.store("out", ix.add(slot, 1), tn)
    out = np.full(2 * tiles_n * tiles_m, -1, np.int32)
    run(kb.finish(), {"out": out})
    return [tuple(int(v) for v in pair) for pair in out.reshape(-1, 2)]


@pytest.mark.parametrize("tiles_n,tiles_m,band", [(5, 7, 3), (4, 8, 4), (6, 2, 8), (3, 5, 1)])
def test_tile_order_covers_every_tile_once_a_band_at_a_time(tiles_n, tiles_m, band):
    order = launch_order(tiles_n, tiles_m, band)
    assert sorted(order) == [(m, n) for m in range(tiles_m) for n in range(tiles_n)]
    if band == 1:
        assert order == sorted(order)              # one tile row after another
        return
    rows = min(band, tiles_m)
    first = order[:rows * tiles_n]                 # the first band, column by column
    assert first == [(m, n) for n in range(tiles_n) for m in range(rows)]
