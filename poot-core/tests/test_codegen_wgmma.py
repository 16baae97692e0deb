"""The warpgroup GEMM schedule (lower/wgmma.py): where it is chosen, what its kernel
declares, and the refusals around it (the kernel checker, the interpreter). Its results
are checked on the GPU (poot-backend-cuda/bench/wgmma_gemm.py, docs/performance.md)."""
from __future__ import annotations

import numpy as np
import pytest
from poot.codegen.builder import KernelBuilder
from poot.codegen.expr import i32
from poot.codegen.interp import KernelFault, run_lowering
from poot.codegen.lower import lower, wgmma
from poot.codegen.program import (
    Access,
    MmaTile,
    SmemTile,
    TensorMap,
    TmaLoad,
    Wgmma,
)
from poot.codegen.target import FEATURES, TMA, WGMMA
from poot.dtypes import DType
from poot.errors import IRError
from poot.ir.ops import MatMul
from poot.ir.types import TensorType

BF16, F16, F32 = DType.BF16, DType.F16, DType.F32


def kernel_of(a_shape, w_shape, dt, features=FEATURES):
    a, w = TensorType(a_shape, dt), TensorType(w_shape, dt)
    return lower(MatMul(), [a, w], MatMul().infer([a, w]), features).kernels[0]


def uses(kernel, stmt) -> bool:
    return any(isinstance(s, stmt) for s in kernel.statements())


@pytest.mark.parametrize("a_shape,w_shape,dt,chosen", [
    ((4096, 4096), (4096, 4096), BF16, True),
    ((200, 136), (136, 520), F16, True),               # edges of M, N and K
    ((2, 130, 128), (2, 128, 264), BF16, True),        # batches of whole K steps
    ((3, 96, 192), (192, 136), BF16, True),            # a weight broadcast over batches
    ((2, 130, 72), (2, 72, 264), BF16, False),         # a K step would read the next batch
    ((32, 64), (64, 128), BF16, False),                # too few rows
    ((128, 64), (64, 128), F32, False),                # not 16-bit operands
])
def test_warpgroup_schedule_is_chosen_where_it_applies(a_shape, w_shape, dt, chosen):
    k = kernel_of(a_shape, w_shape, dt)
    assert uses(k, Wgmma) is chosen
    assert bool(k.tensor_maps) is chosen


def test_targets_without_both_features_keep_the_mma_schedule():
    for missing in (WGMMA, TMA):
        k = kernel_of((256, 128), (128, 256), BF16, FEATURES - {missing})
        assert uses(k, MmaTile) and not uses(k, Wgmma)


def test_kernel_declares_tensor_maps_and_swizzle_aligned_stages():
    m, k, n = 200, 136, 520
    kern = kernel_of((m, k), (k, n), BF16)
    sc = wgmma.NARROW                       # 6 tiles of SCHEDULE's: too few
    maps = {t.name: t for t in kern.tensor_maps}
    assert (maps["map_a"].buffer, maps["map_a"].rows, maps["map_a"].cols) == ("in0", m, k)
    assert (maps["map_w"].buffer, maps["map_w"].rows, maps["map_w"].cols) == ("in1", k, n)
    assert (maps["map_a"].box_rows, maps["map_a"].box_cols) == (sc.bm, 64)
    tiles = [a for a in kern.shared if a.name.startswith("tile_")]
    assert all(a.align == 1024 for a in tiles)
    assert sum(a.count * 2 for a in tiles) == sc.stages * sc.stage_bytes(BF16)
    assert kern.workgroup == (sc.threads,) and kern.grid == (-(-n // sc.bn), -(-m // sc.bm), 1)
    tma = [s for s in kern.statements() if isinstance(s, TmaLoad)]
    assert len(tma) == 1 + sc.bn // 64      # A's box and the weight's per K step


@pytest.mark.parametrize("m,n,batch,chosen", [
    (4096, 4096, 1, wgmma.SCHEDULE), (1024, 4096, 1, wgmma.SCHEDULE),
    (512, 4096, 1, wgmma.NARROW), (512, 4096, 2, wgmma.SCHEDULE), (200, 520, 1, wgmma.NARROW)])
def test_few_tiles_take_the_narrow_schedule(m, n, batch, chosen):
    from types import SimpleNamespace
    assert wgmma.schedule_for(SimpleNamespace(m=m, n=n, batch=batch)) is chosen


def test_interpreter_refuses_the_warpgroup_kernel():
    a, w = TensorType((128, 64), BF16), TensorType((64, 128), BF16)
    lowering = lower(MatMul(), [a, w], MatMul().infer([a, w]), FEATURES)
    ops = [np.zeros(t.shape, np.float32).astype(BF16.numpy) for t in (a, w)]
    with pytest.raises(KernelFault, match="not interpreted"):
        run_lowering(lowering, ops, MatMul().infer([a, w]))


def _tile_kernel(align: int, tensor_map: str = "map"):
    kb = KernelBuilder("k", (1,), (128,))
    kb.buffer("in0", BF16, Access.READ, 64 * 64, operand=0)
    kb.tensor_map(TensorMap("map", "in0", 64, 64, 64, 64))
    tile = kb.shared("tile", BF16, 64 * 64, align).name
    bars = kb.shared("bars", DType.U32, 2).name
    acc = kb.local("acc", F32, 32).name
    kb.emit(TmaLoad(tensor_map, tile, i32(0), i32(0), i32(0), bars, i32(0)))
    kb.emit(Wgmma(acc, 64, BF16, SmemTile(tile, i32(0), True),
                  SmemTile(tile, i32(0), False, 8192)))
    return kb.finish()


def test_checker_accepts_a_well_formed_warpgroup_kernel():
    assert _tile_kernel(1024).tensor_maps


def test_checker_refuses_tiles_off_the_swizzle_alignment():
    with pytest.raises(IRError, match="aligned to 1024"):
        _tile_kernel(16)


def test_checker_refuses_a_copy_from_an_undeclared_tensor_map():
    with pytest.raises(IRError, match="unknown tensor map"):
        _tile_kernel(1024, tensor_map="other")
