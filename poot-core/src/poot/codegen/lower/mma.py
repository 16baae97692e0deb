"""The tensor-core GEMM schedule, for targets with MMA and COPY_ASYNC statements.

out[b, m, n] = sum_k a[b, m, k] * w[b, ., .] with 16-bit float operands (BF16 or F16,
the same on both sides) and F32 accumulation, then the problem's own store (cast,
epilogue). By default (`Schedule`) a workgroup of 8 warps owns a 128 x 128 output tile,
each warp a 64 x 32 block (4 x 4 MmaTile tiles of 16 x 8, 64 accumulators per thread).
K advances 64 at a time through shared memory, 2 stages deep: 16-byte async copies fill the stages
ahead while the tensor cores read the current one, so loads and products overlap.
Shared rows are padded by 16 bytes, which keeps the eight rows that one 8x8 matrix
load touches in distinct banks.

Edges: a 16-byte chunk past M, N or K is zero-filled instead of read, so any M and
any K, N that are multiples of 8 work (chunks never straddle an edge).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from poot.codegen import index as ix
from poot.codegen.expr import Const, Expr, Load, i32
from poot.codegen.program import MmaTile, group_id, local_index
from poot.codegen.target import COPY_ASYNC, MMA_M16N8K16, matrix_unit
from poot.dtypes import DType

PAD = 4                          # words (16 bytes) after each shared row
CHUNK = 8                        # 16-bit values per 16-byte copy
MIN_ROWS = 64                    # below this the FMA tiles waste less
UNIT = MMA_M16N8K16              # the matrix unit the schedule's tiling is written for


@dataclass(frozen=True)
class Schedule:
    """Workgroup tile bm x bn, K step bk, `stages` shared buffers in flight, a
    warps_m x warps_n grid of warps (each owns (bm / warps_m) x (bn / warps_n))."""

    bm: int = 128
    bn: int = 128
    bk: int = 64
    stages: int = 2
    warps_m: int = 2
    warps_n: int = 4

    @property
    def threads(self) -> int:
        return UNIT.lanes * self.warps_m * self.warps_n

    @property
    def tm(self) -> int:           # 16-row tiles per warp
        return self.bm // self.warps_m // 16

    @property
    def tn(self) -> int:           # 8-column tiles per warp
        return self.bn // self.warps_n // 8


#: the schedule lowerings use (bench_gpu.py times alternatives against it)
SCHEDULE = Schedule()


@dataclass(frozen=True)
class TileOperand:
    """A 16-bit operand the schedule copies straight into shared memory: buffer `buffer`
    holds `dtype` values; `k_major` when its rows run along K ([rows, K], a weight in
    checkpoint order or the activation), else [K, cols]; `offset(b)` is batch b's first
    element."""

    buffer: str
    dtype: DType
    k_major: bool
    offset: Callable[[Expr], Expr]


@dataclass(frozen=True)
class Tiles:
    a: TileOperand       # [M, K]
    w: TileOperand       # [N, K] (k_major) or [K, N]


def tiles_for(n: int, k: int, a: TileOperand, w: TileOperand) -> Tiles | None:
    """Tile operands when the problem fits the schedule: one 16-bit float type on both
    sides, K and N in whole 16-byte chunks."""
    if a.dtype is not w.dtype or a.dtype not in (DType.BF16, DType.F16):
        return None
    if k % CHUNK or n % CHUNK or not a.k_major:
        return None
    return Tiles(a, w)


def usable(p, features) -> bool:
    """This schedule is written for 16 x 8 x 16 tiles over 32 lanes: targets whose matrix
    unit is that one, and that copy asynchronously."""
    return (p.tiles is not None and matrix_unit(features) is UNIT and COPY_ASYNC in features
            and p.m >= MIN_ROWS and not p.w_per_row)


def mma_gemm_kernel(p, kb_factory, declare, sc: Schedule | None = None):
    sc = sc or SCHEDULE
    BM, BN, BK, STAGES, THREADS = sc.bm, sc.bn, sc.bk, sc.stages, sc.threads  # noqa: N806
    WARPS_M, WARPS_N, TM, TN = sc.warps_m, sc.warps_n, sc.tm, sc.tn           # noqa: N806
    t: Tiles = p.tiles
    grid = (-(-p.n // BN), -(-p.m // BM), p.batch)
    kb = kb_factory(grid, (THREADS,))
    declare(kb)
    src_a, src_w = kb.array(t.a.buffer), kb.array(t.w.buffer)
    a_pitch = BK // 2 + PAD
    if t.w.k_major:
        w_rows, w_pitch = BN, BK // 2 + PAD           # [n][k]
    else:
        w_rows, w_pitch = BK, BN // 2 + PAD           # [k][n]
    a_stage, w_stage = BM * a_pitch, w_rows * w_pitch
    sa = kb.shared("tile_a", DType.U32, STAGES * a_stage)
    sw = kb.shared("tile_w", DType.U32, STAGES * w_stage)
    acc = kb.local("acc", DType.F32, 4 * TM * TN)
    for r in range(4 * TM * TN):
        kb.store(acc, r, Const(0.0, DType.F32))

    tid = local_index()
    lane = kb.let("lane", ix.mod(tid, UNIT.lanes))
    warp = kb.let("warp", ix.div(tid, UNIT.lanes))
    wm = kb.let("wm", ix.div(warp, WARPS_N))
    wn = kb.let("wn", ix.mod(warp, WARPS_N))
    m0 = kb.let("m0", ix.mul(group_id(1), BM))
    n0 = kb.let("n0", ix.mul(group_id(0), BN))
    b = group_id(2)
    a_base = kb.let("a_base", t.a.offset(b))
    w_base = kb.let("w_base", t.w.offset(b))
    k_tiles = -(-p.k // BK)

    def copy_rows(dst, stage_words, src, base, rows, cols, pitch, row0, col0, n_rows, n_cols):
        """Copy a rows x cols block (cols in values, whole chunks) of a row-major
        [n_rows, n_cols] operand, starting at (row0, col0), into `dst`."""
        per_row = cols // CHUNK
        for u in range(rows * per_row // THREADS):
            c = ix.add(tid, THREADS * u)
            row = kb.let("row", ix.div(c, per_row))
            col = kb.let("col", ix.mul(ix.mod(c, per_row), CHUNK))
            gr, gc = ix.add(row0, row), ix.add(col0, col)
            ok = ix.both(ix.lt(gr, i32(n_rows)), ix.lt(gc, i32(n_cols)))
            at = ix.add(base, ix.add(ix.mul(ix.minimum(gr, i32(n_rows - 1)), n_cols),
                                     ix.minimum(gc, i32(n_cols - CHUNK))))
            slot = ix.add(stage_words, ix.add(ix.mul(row, pitch), ix.div(col, 2)))
            kb.copy_async(dst, slot, src, at, ok)

    def load_stage(stage, kt):
        """Issue the copies of K step kt into shared stage `stage` (no commit)."""
        k0 = kb.let("k0", ix.mul(kt, BK))
        copy_rows(sa, ix.mul(stage, a_stage), src_a, a_base, BM, BK, a_pitch, m0, k0,
                  p.m, p.k)
        if t.w.k_major:
            copy_rows(sw, ix.mul(stage, w_stage), src_w, w_base, BN, BK, w_pitch, n0, k0,
                      p.n, p.k)
        else:
            copy_rows(sw, ix.mul(stage, w_stage), src_w, w_base, BK, BN, w_pitch, k0, n0,
                      p.k, p.n)

    # stages - 1 K steps in flight before the first product; then, per step: wait for
    # the oldest, barrier (its copies are visible, and every warp is done with the
    # stage the next copies overwrite), issue the step stages - 1 ahead, multiply.
    for s in range(STAGES - 1):
        if s < k_tiles:
            load_stage(i32(s), i32(s))
        kb.copy_commit()                     # empty batches keep the wait count uniform
    with kb.for_("kt", 0, k_tiles) as kt:
        stage = kb.let("stage", ix.mod(kt, STAGES))
        kb.copy_wait(STAGES - 2)
        kb.barrier()
        ahead = ix.add(kt, STAGES - 1)
        with kb.if_(ix.lt(ahead, i32(k_tiles))):
            load_stage(ix.mod(ahead, STAGES), ahead)
        kb.copy_commit()
        for kk in range(BK // 16):
            if t.w.k_major:
                b_col = ix.add(ix.mul(stage, BN), ix.mul(wn, BN // WARPS_N))
                b_word = i32(kk * 8)
            else:
                b_col = ix.mul(wn, BN // WARPS_N)
                b_word = ix.mul(ix.add(ix.mul(stage, BK), kk * 16), w_pitch)
            kb.mma(MmaTile(acc.name, 0, TM, TN, t.a.dtype,
                           sa.name, ix.add(ix.mul(stage, BM), ix.mul(wm, BM // WARPS_M)),
                           i32(kk * 8), a_pitch,
                           sw.name, b_col, b_word, w_pitch, b_trans=not t.w.k_major,
                           unit=UNIT))

    row_base = kb.let("rb", ix.add(m0, ix.mul(wm, BM // WARPS_M)))
    col_base = kb.let("cb", ix.add(n0, ix.mul(wn, BN // WARPS_N)))
    quad, pair = kb.let("quad", ix.div(lane, 4)), kb.let("pair", ix.mul(ix.mod(lane, 4), 2))
    for i in range(TM):
        for j in range(TN):
            for r in range(4):
                dr, dc = UNIT.coords(0, r)           # the lane's part is quad / pair
                m = kb.let("m", ix.add(row_base, ix.add(quad, 16 * i + dr)))
                n = kb.let("n", ix.add(col_base, ix.add(pair, 8 * j + dc)))
                with kb.if_(ix.both(ix.lt(m, i32(p.m)), ix.lt(n, i32(p.n)))):
                    p.store(kb, b, m, n, Load(acc.name, i32(4 * (i * TN + j) + r), DType.F32))
    return kb.finish()

