"""Contraction outputs (poot.codegen.lower.output): a warp's 16-row block of accumulator
tiles stored directly or staged through shared memory, run by the kernel interpreter."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from poot.codegen import index as ix
from poot.codegen.builder import KernelBuilder
from poot.codegen.expr import i32
from poot.codegen.interp import KernelFault, run
from poot.codegen.lower.output import FlatStore, staged_columns, staging, store_block
from poot.codegen.program import OUT, Access, GroupBarrier, StoreWide, local_index
from poot.codegen.target import MMA_M16N8K16
from poot.dtypes import DType

M, N, WARPS, COLUMNS = 20, 48, 2, 64     # the second warp's rows and the last columns ragged


def block_kernel(dtype: DType, wide: bool, staged: bool = True):
    """Each of two warps stores a 16 x 64 block whose value at (row, column) is
    row * 64 + column (exact in f16), into out [M, N]."""
    p = SimpleNamespace(m=M, n=N, store=FlatStore(dtype, M, N))
    kb = KernelBuilder("block", (1,), (32 * WARPS,))
    kb.buffer("out", dtype, Access.WRITE, M * N, operand=OUT)
    lane, warp = kb.let("lane", ix.mod(local_index(), 32)), kb.let("w", ix.div(local_index(), 32))
    m = kb.let("m0", ix.mul(warp, 16))
    quad, pair = ix.div(lane, 4), ix.mul(ix.mod(lane, 4), 2)
    tiles = []
    for j in range(COLUMNS // 8):
        values = []
        for r in range(4):
            dr, dc = MMA_M16N8K16.coords(0, r)
            row, col = ix.add(m, ix.add(quad, dr)), ix.add(pair, 8 * j + dc)
            values.append(ix.add(ix.mul(row, 64), col).cast(DType.F32))
        tiles.append(values)
    rows = staging(kb, p, COLUMNS, WARPS, warp, wide) if staged else None
    store_block(kb, p, i32(0), m, i32(0), lane, tiles, wide, rows)
    return kb.finish(), rows.chunk if rows else 0


def want(dtype: DType) -> np.ndarray:
    rows, cols = np.meshgrid(np.arange(M), np.arange(N), indexing="ij")
    return (rows * 64 + cols).astype(dtype.numpy)


@pytest.mark.parametrize("dtype, chunk", [(DType.F16, 64), (DType.F32, 32)])
def test_a_staged_block_stores_whole_row_segments(dtype, chunk):
    kernel, got_chunk = block_kernel(dtype, wide=True)
    assert got_chunk == chunk
    stores = [s for s in kernel.statements() if isinstance(s, StoreWide) and s.array == "out"]
    assert stores and all(len(s.values) * dtype.itemsize == 16 for s in stores)
    assert any(isinstance(s, GroupBarrier) for s in kernel.statements())
    out = np.full(M * N, -1, dtype.numpy)
    run(kernel, {"out": out})
    assert np.array_equal(out.reshape(M, N), want(dtype))


@pytest.mark.parametrize("wide", [True, False], ids=["pairs", "single"])
def test_an_unstaged_block_stores_each_tile(wide):
    kernel, chunk = block_kernel(DType.F16, wide=wide, staged=False)
    assert chunk == 0
    out = np.full(M * N, -1, np.float16)
    run(kernel, {"out": out})
    assert np.array_equal(out.reshape(M, N), want(DType.F16))


def test_staging_needs_its_group_barriers(monkeypatch):
    """Without the warp's barrier a lane reads rows another lane wrote: the interpreter
    faults (the barrier is what makes the staged copy correct)."""
    monkeypatch.setattr(KernelBuilder, "group_barrier", lambda self, width: None)
    kernel, _ = block_kernel(DType.F16, wide=True)
    with pytest.raises(KernelFault, match="missing Barrier"):
        run(kernel, {"out": np.zeros(M * N, np.float16)})


def test_staging_is_declined_where_segments_do_not_fit():
    """No WIDE_LOADS, a store that is not flat, 8-bit outputs or N in part segments: the
    block is stored tile by tile."""
    flat = SimpleNamespace(m=M, n=N, store=FlatStore(DType.F16, M, N))
    assert staged_columns(flat, COLUMNS, wide=False) == 0
    assert staged_columns(SimpleNamespace(m=M, n=N, store=lambda *a: None), COLUMNS, True) == 0
    assert staged_columns(SimpleNamespace(m=M, n=N, store=FlatStore(DType.U8, M, N)),
                          COLUMNS, True) == 0
    assert staged_columns(SimpleNamespace(m=M, n=44, store=FlatStore(DType.F16, M, 44)),
                          COLUMNS, True) == 0
