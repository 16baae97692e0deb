"""The tensor-core GEMM schedule, for targets with an MMA statement.

out[b, m, n] = sum_k a[b, m, k] * w[b, ., .] with 16-bit float products and F32
accumulation, then the problem's own store (cast, epilogue). A workgroup owns a bm x bn
output tile (`Schedule`), its warps a warps_m x warps_n grid of blocks of it (4 MmaTile
accumulators per thread per 16 x 8 tile), and warps_k warps each block, each taking its
own slice of every K step (their sums added through shared memory at the end: a
narrow problem's workgroups are few, and fewer K steps per workgroup is less latency).
K advances bk at a time through `stages` shared buffers, filled by a stager
(`poot.codegen.lower.mma_operands`):

* 16-bit operands as they lie (both BF16 or both F16, M >= MIN_ROWS, a target that copies
  asynchronously): 128 x 128 tiles of 8 warps fed by async copies (`SCHEDULE`).
* Everything else whose weight is packed or 16-bit in checkpoint order, with F32
  activations (a decode batch, a prefill chunk): each operand split into hi and lo bf16
  parts computed in registers (a packed weight by its format's decode program), and three
  products hi.hi + hi.lo + lo.hi per step. One bf16 part per operand, eight bits, would
  miss the contractions' conformance bound (NMSE 3.7e-9 against f32) by orders of
  magnitude; two parts, each rounded to nearest, hold an operand within ~2^-17 and the
  dropped lo.lo term is ~2^-18 of a product (NMSE 1.3-1.9e-11 measured on an H200), and
  the tensor cores have the rate to spare at these sizes (they wait on the decode and
  the loads). Chosen past the rows GEMV's 32 rows
  (`DECODE`), and over a wide head from 16 rows (`WIDE`); at 16..32 rows of SmolLM2's
  narrow shapes (N 192..1536) the rows GEMV's many warps are faster than these few
  workgroups, each latency-bound on its decode.

Shared rows are padded by 16 bytes, which keeps the eight rows that one 8x8 matrix
load touches in distinct banks. Edges: rows past M or N and K past its end are zeros
(a copied chunk never straddles an edge: K and N multiples of 8 for async copies).
"""
from __future__ import annotations

from dataclasses import dataclass

from poot.codegen import index as ix
from poot.codegen.expr import Const, Load, i32
from poot.codegen.lower.mma_operands import AsyncTiles, SplitTiles
from poot.codegen.lower.output import store_block
from poot.codegen.program import MmaTile, group_id, local_index
from poot.codegen.target import COPY_ASYNC, MMA_M16N8K16, matrix_unit
from poot.dtypes import DType

MIN_ROWS = 64                    # below this the FMA tiles waste less (16-bit operands)
SPLIT_MIN_ROWS = 33              # split operands past the rows GEMV's rows (DotSchedule.batch_rows)
SPLIT_WIDE_N = 8192              # ... and over this many columns from SPLIT_WIDE_ROWS rows
SPLIT_WIDE_ROWS = 16
UNIT = MMA_M16N8K16              # the matrix unit the schedule's tiling is written for
#: the products of the split operands' (a part, w part); one part: (0, 0)
SPLIT_PRODUCTS = ((0, 0), (0, 1), (1, 0))


@dataclass(frozen=True)
class Schedule:
    """Workgroup tile bm x bn, K step bk, `stages` shared buffers in flight, a
    warps_m x warps_n grid of warps (each owns (bm / warps_m) x (bn / warps_n)), each
    block taken by warps_k warps (bk / warps_k of each K step each); tiles walked
    `band` tile rows at a time (`tile_order`)."""

    bm: int = 128
    bn: int = 128
    bk: int = 64
    stages: int = 2
    warps_m: int = 2
    warps_n: int = 4
    warps_k: int = 1
    band: int = 1

    @property
    def threads(self) -> int:
        return UNIT.lanes * self.warps_m * self.warps_n * self.warps_k

    @property
    def tm(self) -> int:           # 16-row tiles per warp
        return self.bm // self.warps_m // 16

    @property
    def tn(self) -> int:           # 8-column tiles per warp
        return self.bn // self.warps_n // 8

    @property
    def k_slice(self) -> int:      # K per warp per step
        return self.bk // self.warps_k


#: the schedule of 16-bit operands copied as they lie (bench_gpu.py times alternatives)
SCHEDULE = Schedule()
#: the schedule of split operands: a prefill chunk or a batch past the rows GEMV's rows.
#: 32-row tiles whose K steps split over 4 warps: twice the workgroups of 64-row tiles,
#: each warp a shorter chain of decode and products (the sweep in docs/performance.md,
#: 2026-12-04)
DECODE = Schedule(bm=32, bn=32, bk=128, warps_m=1, warps_n=1, warps_k=4)
#: over wide N (a model's head) from SPLIT_WIDE_ROWS rows, by the most rows each takes
WIDE = ((16, Schedule(bm=16, bn=64, bk=64, warps_m=1, warps_n=1, warps_k=4)),
        (32, Schedule(bm=32, bn=64, bk=64, warps_m=1, warps_n=1, warps_k=4)))


def usable(p, features) -> bool:
    """16-bit operands as they lie: targets whose matrix unit is 16 x 8 x 16 tiles over
    32 lanes (the schedule is written for that one), and that copy asynchronously."""
    return (p.tiles is not None and matrix_unit(features) is UNIT and COPY_ASYNC in features
            and p.m >= MIN_ROWS and not p.w_per_row)


def decode_schedule(p, features) -> Schedule | None:
    """The split-operand schedule for `p` on a target with the matrix unit, or None (the
    FMA schedules: at SmolLM2's narrow decode shapes, 16..32 rows, the rows GEMV is faster;
    docs/performance.md)."""
    if matrix_unit(features) is not UNIT:
        return None
    if p.m >= SPLIT_MIN_ROWS:
        sc = DECODE
    elif p.n >= SPLIT_WIDE_N and p.m >= SPLIT_WIDE_ROWS:
        sc = next(s for rows, s in WIDE if p.m <= rows)
    else:
        return None
    return sc if SplitTiles.fits(sc, p) else None


def tile_order(kb, tiles_n: int, tiles_m: int, band: int):
    """(tile row, tile column) of this workgroup. Workgroups start in launch order, which
    walks columns first; with `band` > 1 that order runs down each column of a band of
    `band` tile rows before the next column, so the workgroups resident at once read a
    few bands of A and a few columns of the weight rather than one row of A and the
    whole weight: what they share stays in L2 on problems whose weight does not."""
    if band <= 1 or tiles_m == 1:
        return group_id(1), group_id(0)
    linear = kb.let("tile", ix.add(group_id(0), ix.mul(group_id(1), tiles_n)))
    per_band = band * tiles_n
    first = kb.let("band_m", ix.mul(ix.div(linear, per_band), band))
    rows = kb.let("band_rows", ix.minimum(ix.sub(i32(tiles_m), first), i32(band)))
    within = kb.let("in_band", ix.mod(linear, per_band))
    return ix.add(first, ix.mod(within, rows)), ix.div(within, rows)


def mma_gemm_kernel(p, kb_factory, declare, sc: Schedule | None = None, split: bool = False,
                    wide: bool = False):
    """`p` on tensor cores under `sc` (default SCHEDULE): its 16-bit operands copied as
    they are, or `split` into computed hi and lo parts (SplitTiles); `wide`: the target
    has WIDE_LOADS (pairs of outputs stored at once, `output.store_block`)."""
    sc = sc or SCHEDULE
    wm_n, tm, tn = sc.warps_m * sc.warps_n, sc.tm, sc.tn
    regs = 4 * tm * tn
    grid = (-(-p.n // sc.bn), -(-p.m // sc.bm), p.batch)
    kb = kb_factory(grid, (sc.threads,))
    declare(kb)
    acc = kb.local("acc", DType.F32, regs)
    for r in range(regs):
        kb.store(acc, r, Const(0.0, DType.F32))

    tid = local_index()
    lane = kb.let("lane", ix.mod(tid, UNIT.lanes))
    warp = kb.let("warp", ix.div(tid, UNIT.lanes))
    wk = kb.let("wk", ix.div(warp, wm_n))
    wmn = kb.let("wmn", ix.mod(warp, wm_n))
    wm = kb.let("wm", ix.div(wmn, sc.warps_n))
    wn = kb.let("wn", ix.mod(wmn, sc.warps_n))
    tile_m, tile_n = tile_order(kb, grid[0], grid[1], sc.band)
    m0 = kb.let("m0", ix.mul(tile_m, sc.bm))
    n0 = kb.let("n0", ix.mul(tile_n, sc.bn))
    b = group_id(2)
    tiles = (SplitTiles if split else AsyncTiles)(kb, sc, p, b, m0, n0, tid)
    products = SPLIT_PRODUCTS if split else ((0, 0),)
    k_tiles = -(-p.k // sc.bk)
    k_first = kb.let("kw", ix.mul(wk, sc.k_slice // 2))       # the warp's slice, in words

    tiles.prologue(k_tiles)
    with kb.for_("kt", 0, k_tiles) as kt:
        tiles.step(kt, k_tiles)
        stage = kb.let("stage", ix.mod(kt, sc.stages))
        for kk in range(sc.k_slice // 16):
            a_word = ix.add(k_first, kk * 8)
            for pa, pw in products:
                a_row = ix.add(ix.mul(ix.add(ix.mul(stage, tiles.parts), pa), sc.bm),
                               ix.mul(wm, sc.bm // sc.warps_m))
                if tiles.k_major:
                    b_col = ix.add(ix.mul(ix.add(ix.mul(stage, tiles.parts), pw), sc.bn),
                                   ix.mul(wn, sc.bn // sc.warps_n))
                    b_word = a_word
                else:
                    b_col = ix.mul(wn, sc.bn // sc.warps_n)
                    b_word = ix.mul(ix.add(ix.add(ix.mul(stage, sc.bk), ix.mul(k_first, 2)),
                                           kk * 16), tiles.w_pitch)
                kb.mma(MmaTile(acc.name, 0, tm, tn, tiles.dtype,
                               tiles.sa.name, a_row, a_word, tiles.a_pitch,
                               tiles.sw.name, b_col, b_word, tiles.w_pitch,
                               b_trans=not tiles.k_major, unit=UNIT))
    if sc.warps_k > 1:
        _sum_k_slices(kb, sc, acc, regs, lane, wk, wmn)

    row_base = kb.let("rb", ix.add(m0, ix.mul(wm, sc.bm // sc.warps_m)))
    col_base = kb.let("cb", ix.add(n0, ix.mul(wn, sc.bn // sc.warps_n)))
    with kb.if_(ix.eq(wk, i32(0))):
        for i in range(tm):
            store_block(kb, p, b, ix.add(row_base, 16 * i), col_base, lane,
                        [[Load(acc.name, i32(4 * (i * tn + j) + r), DType.F32)
                          for r in range(4)] for j in range(tn)], wide)
    return kb.finish()


def _sum_k_slices(kb, sc: Schedule, acc, regs: int, lane, wk, wmn) -> None:
    """Warps 1.. of each block's K split leave their accumulators in shared memory;
    warp 0 adds them to its own (same lane, same register: the same output)."""
    wm_n = sc.warps_m * sc.warps_n
    red = kb.shared("acc_k", DType.F32, (sc.warps_k - 1) * wm_n * regs * UNIT.lanes)

    def slot(k, r):
        return ix.add(ix.mul(ix.add(ix.mul(ix.add(ix.mul(k, wm_n), wmn), regs), r),
                             UNIT.lanes), lane)
    with kb.if_(ix.lt(i32(0), wk)):
        for r in range(regs):
            kb.store(red, slot(ix.add(wk, -1), r), acc[r])
    kb.barrier()
    with kb.if_(ix.eq(wk, i32(0))):
        for r in range(regs):
            total = acc[r]
            for k in range(sc.warps_k - 1):
                total = total + red[slot(i32(k), r)]
            kb.store(acc, r, total)
