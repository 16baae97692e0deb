"""The warpgroup GEMM schedule, for targets with the WGMMA and TMA features (CUDA sm_90a).

The problem is mma.py's (`Problem.tiles`: 16-bit float operands on both sides, F32
accumulation, the problem's own store); the machinery is Hopper's. A workgroup owns a
bm x bn output tile with 1 + bm / 64 warpgroups: warpgroup 0 produces, one thread of
it copying each K step's A box (bm x 64) and the weight's boxes (64 x 64 each) into
shared stage kt % stages with bulk tensor copies that complete on that stage's `full`
mbarrier; each other warpgroup consumes, multiplying its 64 rows by the stage with
warpgroup products (m64 n=bn k16, four per K step) and arriving on the stage's `empty`
mbarrier once the products that read it are done, which is what the producer waits
for before refilling it. One batch of products stays in flight while the next stage's
copies land, so the tensor cores never wait on a barrier of their own warpgroup.

A is K-major (rows along K, 128-byte swizzled rows of 64 values); the weight is [K, N]
(rows along N), which the products read transposed, or K-major too ([N, K], a checkpoint
weight as it lies: one box of bn rows a stage, read by the products as A is), in which
case a depth that repeats it (`w_period`: the bf16 planes' [hi | lo] activation against
one weight) reads it again for each period; `period_flags` (an I32 per tile row of bm
rows) then skip the K steps past the first period for a tile row whose flag is 0 (its
second plane holds only zeros). Edges: the tensor maps read zeros
past M, N and K, and stores past M or N are skipped, so any M and K, N that are
multiples of 8 work. Batches: both operands are seen as one tall matrix whose batch b
starts at row offset(b) / row length; a box that runs past M only feeds rows that are
never stored, but one past K would read the next batch, so batched problems need K a
multiple of bk.
"""
from __future__ import annotations

from dataclasses import dataclass

from poot.codegen import index as ix
from poot.codegen.expr import Const, Load, Sel, i32
from poot.codegen.lower.mma import MIN_ROWS, tile_order
from poot.codegen.lower.mma_operands import Tiles
from poot.codegen.lower.output import staging, store_block
from poot.codegen.program import (
    SWIZZLE_BYTES,
    SWIZZLE_SPAN,
    MbarArrive,
    MbarInit,
    MbarWait,
    RegisterBudget,
    SmemTile,
    TensorMap,
    TmaLoad,
    Wgmma,
    WgmmaCommit,
    WgmmaWait,
    group_id,
    local_index,
)
from poot.codegen.target import TMA, WGMMA
from poot.dtypes import DType

WARPGROUP = 128                  # threads of one warpgroup
ROWS = 64                        # output rows of one warpgroup product
K_STEP = 16                      # K of one warpgroup product
BOX = SWIZZLE_BYTES // 2         # 16-bit values in one swizzled row
PRODUCER_REGISTERS = 40          # the copying warpgroup needs few
CONSUMER_REGISTERS = 232         # what the multiplying ones take of the rest


@dataclass(frozen=True)
class Schedule:
    """Workgroup tile bm x bn (bm / 64 consumer warpgroups, bn <= 256 one product wide),
    K step bk (one swizzled row: 64), `stages` shared stages in flight; workgroups walk
    the tiles `band` tile rows at a time (`tile_order`; 1: one tile row after another)."""

    bm: int = 128
    bn: int = 256
    bk: int = BOX
    stages: int = 4
    band: int = 1

    @property
    def consumers(self) -> int:
        return self.bm // ROWS

    @property
    def threads(self) -> int:
        return WARPGROUP * (1 + self.consumers)

    def stage_bytes(self, dtype: DType) -> int:
        return (self.bm + self.bn) * self.bk * dtype.itemsize


#: the schedule lowerings use (bench/wgmma_gemm.py times alternatives against it)
SCHEDULE = Schedule(band=16)
#: ... and where its tiles are fewer than NARROW_TILES: half as wide, twice as many
NARROW = Schedule(bn=128, stages=6, band=16)
NARROW_TILES = 128


def schedule_for(p) -> Schedule:
    """SCHEDULE, or NARROW where SCHEDULE's tiles would leave most multiprocessors idle
    (a workgroup a multiprocessor: 132 on an H100)."""
    tiles = -(-p.m // SCHEDULE.bm) * -(-p.n // SCHEDULE.bn) * p.batch
    return NARROW if tiles < NARROW_TILES else SCHEDULE


def usable(p, features) -> bool:
    """Targets with warpgroup products and bulk tensor copies, operands the tensor maps
    can describe (a [K, N] weight; batches of whole K steps)."""
    t: Tiles | None = p.tiles
    return (t is not None and WGMMA in features and TMA in features
            and p.m >= MIN_ROWS and not p.w_per_row
            and (p.batch == 1 or p.k % SCHEDULE.bk == 0 and not t.w.k_major))


def wgmma_gemm_kernel(p, kb_factory, declare, sc: Schedule | None = None,
                      wide: bool = False, w_period: int | None = None,
                      period_flags: str | None = None):
    """`p` under `sc` (default `schedule_for(p)`); `wide`: the target has WIDE_LOADS (each warp's
    rows staged through shared memory and stored 16 bytes a lane, `output.store_block`);
    `w_period`: a K-major weight of that many columns (a multiple of bk) is read at K
    step k0 mod w_period, and with `period_flags` (a buffer `declare` declares) only its
    first period where the tile row's flag is 0 (module doc)."""
    sc = sc or schedule_for(p)
    BM, BN, BK, STAGES = sc.bm, sc.bn, sc.bk, sc.stages   # noqa: N806
    t: Tiles = p.tiles
    dtype = t.a.dtype
    kb = kb_factory((-(-p.n // BN), -(-p.m // BM), p.batch), (sc.threads,))
    declare(kb)
    a_rows = kb.array(t.a.buffer).count // p.k
    k_major, w_k = t.w.k_major, w_period or p.k
    w_rows = kb.array(t.w.buffer).count // (w_k if k_major else p.n)
    map_a = kb.tensor_map(TensorMap("map_a", t.a.buffer, a_rows, p.k, BM, BK))
    map_w = kb.tensor_map(TensorMap("map_w", t.w.buffer, w_rows, w_k, BN, BK) if k_major
                          else TensorMap("map_w", t.w.buffer, w_rows, p.n, BK, BOX))
    a_stage, w_stage, w_box = BM * BK, BK * BN, BK * BOX     # elements
    sa = kb.shared("tile_a", dtype, STAGES * a_stage, SWIZZLE_SPAN).name
    sw = kb.shared("tile_w", dtype, STAGES * w_stage, SWIZZLE_SPAN).name
    bars = kb.shared("bars", DType.U32, 2 * 2 * STAGES).name   # full[s], then empty[s]
    k_tiles = -(-p.k // BK)

    tid = local_index()
    wg = kb.let("wg", ix.div(tid, WARPGROUP))
    with kb.if_(ix.eq(tid, i32(0))):
        for s in range(STAGES):
            kb.emit(MbarInit(bars, i32(s), 1))
            kb.emit(MbarInit(bars, i32(STAGES + s), WARPGROUP * sc.consumers))
    kb.barrier()
    tile_m, tile_n = tile_order(kb, -(-p.n // BN), -(-p.m // BM), sc.band)
    m0 = kb.let("m0", ix.mul(tile_m, BM))
    if period_flags is not None:       # uniform per workgroup: both roles loop as far
        k_tiles = kb.let("k_tiles", Sel(Load(period_flags, tile_m, DType.I32), i32(k_tiles),
                                        i32(w_period // BK)))
    n0 = kb.let("n0", ix.mul(tile_n, BN))
    b = group_id(2)

    with kb.if_(ix.eq(wg, i32(0))):
        kb.emit(RegisterBudget(PRODUCER_REGISTERS, grow=False))
        with kb.if_(ix.eq(tid, i32(0))):
            row_a = kb.let("row_a", ix.add(ix.div(t.a.offset(b), p.k), m0))
            row_w = kb.let("row_w", ix.div(t.w.offset(b), w_k if k_major else p.n))
            with kb.for_("kt", 0, k_tiles) as kt:
                stage = kb.let("stage", ix.mod(kt, STAGES))
                with kb.if_(ix.lt(i32(STAGES - 1), kt)):   # its last readers are done
                    kb.emit(MbarWait(bars, ix.add(stage, STAGES),
                                     ix.mod(ix.add(ix.div(kt, STAGES), 1), 2)))
                kb.emit(MbarArrive(bars, stage, sc.stage_bytes(dtype)))
                k0 = kb.let("k0", ix.mul(kt, BK))
                kb.emit(TmaLoad(map_a, sa, ix.mul(stage, a_stage), row_a, k0, bars, stage))
                if k_major:
                    kw = k0 if w_period is None else ix.mod(k0, w_period)
                    kb.emit(TmaLoad(map_w, sw, ix.mul(stage, w_stage), ix.add(row_w, n0), kw,
                                    bars, stage))
                for j in range(0 if k_major else BN // BOX):
                    kb.emit(TmaLoad(map_w, sw, ix.add(ix.mul(stage, w_stage), j * w_box),
                                    ix.add(row_w, k0), ix.add(n0, j * BOX), bars, stage))
    with kb.else_():
        kb.emit(RegisterBudget(CONSUMER_REGISTERS, grow=True))
        acc = kb.local("acc", DType.F32, BN // 2)
        for r in range(BN // 2):
            kb.store(acc, r, Const(0.0, DType.F32))
        c = kb.let("c", ix.sub(wg, 1))
        with kb.for_("kc", 0, k_tiles) as kt:
            stage = kb.let("cstage", ix.mod(kt, STAGES))
            kb.emit(MbarWait(bars, stage, ix.mod(ix.div(kt, STAGES), 2)))
            a_first = ix.add(ix.mul(stage, a_stage), ix.mul(c, ROWS * BK))
            for kk in range(BK // K_STEP):
                w_tile = SmemTile(sw, ix.add(ix.mul(stage, w_stage), kk * K_STEP),
                                  k_major=True) if k_major else \
                    SmemTile(sw, ix.add(ix.mul(stage, w_stage), kk * K_STEP * BOX),
                             k_major=False, block_bytes=w_box * dtype.itemsize)
                kb.emit(Wgmma(acc.name, BN, dtype,
                              SmemTile(sa, ix.add(a_first, kk * K_STEP), k_major=True),
                              w_tile, fence=kk == 0))
            kb.emit(WgmmaCommit())
            kb.emit(WgmmaWait(1, acc.name))            # the previous step's products are done
            with kb.if_(ix.lt(i32(0), kt)):
                kb.emit(MbarArrive(bars, ix.add(ix.mod(ix.sub(kt, 1), STAGES), STAGES)))
        kb.emit(WgmmaWait(0, acc.name))

        lane = kb.let("lane", ix.mod(tid, 32))
        row_base = kb.let("rb", ix.add(m0, ix.add(ix.mul(c, ROWS),
                                                  ix.mul(ix.mod(ix.div(tid, 32), 4), 16))))
        warps = WARPGROUP // 32         # the consumers' warps, counted from the first's
        staged = staging(kb, p, BN, sc.consumers * warps, ix.sub(ix.div(tid, 32), warps), wide)
        store_block(kb, p, b, row_base, n0, lane,
                    [[Load(acc.name, i32(4 * j + r), DType.F32) for r in range(4)]
                     for j in range(BN // 8)], wide, staged)
    return kb.finish()
