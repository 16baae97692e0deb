"""How the tensor-core schedule's operands reach shared memory (`poot.codegen.lower.mma`).

A stager owns the shared tiles of both operands: A as [rows][K] and W as [cols][K] (or
[K][cols]) in U32 words of two 16-bit values, rows padded by PAD words, `stages` K steps
deep and `parts` tiles per step (part p of stage s holds rows (s * parts + p) * rows ..).
Per K step it makes its stage readable by every warp (`step`, barrier included).

* `AsyncTiles`: 16-bit operands as they lie (`Tiles`), copied by 16-byte async copies
  issued stages - 1 steps ahead, one part.
* `SplitTiles`: operands that are computed, not copied: the activation's F32 elements,
  the weight's decode program (`Problem.w_run`, or its 16-bit pairs `w_pair`). Each
  value x goes to shared memory as two bf16 parts, hi = x rounded to bf16 and lo = x - hi
  (exact) rounded to bf16, so hi + lo is x within about 2^-17 of |x|; the schedule
  multiplies hi.hi + hi.lo + lo.hi. The loads of step kt + 1 are issued into
  registers (`KernelBuilder.hold`) before step kt's products, so their latency hides
  behind the tensor cores, and two stages need one barrier per step.
"""
from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass

from poot.codegen import index as ix
from poot.codegen.expr import Const, Expr, Sel, i32, u32
from poot.dtypes import DType

PAD = 4                          # words (16 bytes) after each shared row
CHUNK = 8                        # 16-bit values per 16-byte copy
HIGH = 0xFFFF0000                # the bits of an f32 that a bf16 keeps
HALF = 0x8000                    # half a bf16 unit in the last place, in f32 bits
F32, U32 = DType.F32, DType.U32


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


class _Layout:
    """The shared tiles of one schedule: `sa` [stages * parts * bm][bk], `sw` likewise
    for W ([.. * bn][bk] k_major, else [.. * bk][bn])."""

    def __init__(self, kb, sc, parts: int, k_major: bool):
        self.parts, self.k_major = parts, k_major
        self.a_pitch = sc.bk // 2 + PAD
        self.a_rows = sc.bm
        if k_major:
            self.w_rows, self.w_pitch = sc.bn, sc.bk // 2 + PAD
        else:
            self.w_rows, self.w_pitch = sc.bk, sc.bn // 2 + PAD
        self.sa = kb.shared("tile_a", U32, sc.stages * parts * sc.bm * self.a_pitch)
        self.sw = kb.shared("tile_w", U32, sc.stages * parts * self.w_rows * self.w_pitch)


class AsyncTiles(_Layout):
    """16-bit operands copied as they are (`Tiles`), `stages - 1` K steps in flight."""

    def __init__(self, kb, sc, p, b, m0, n0, tid):
        t: Tiles = p.tiles
        super().__init__(kb, sc, 1, t.w.k_major)
        self.kb, self.sc, self.p, self.m0, self.n0, self.tid = kb, sc, p, m0, n0, tid
        self.dtype = t.a.dtype
        self.src_a, self.src_w = kb.array(t.a.buffer), kb.array(t.w.buffer)
        self.a_base = kb.let("a_base", t.a.offset(b))
        self.w_base = kb.let("w_base", t.w.offset(b))

    def _copy(self, dst, stage_words, src, base, rows, cols, pitch, row0, col0, n_rows,
              n_cols):
        """Copy a rows x cols block (cols in values, whole chunks) of a row-major
        [n_rows, n_cols] operand, starting at (row0, col0), into `dst`."""
        kb, threads = self.kb, self.sc.threads
        per_row = cols // CHUNK
        for u in range(rows * per_row // threads):
            c = ix.add(self.tid, threads * u)
            row = kb.let("row", ix.div(c, per_row))
            col = kb.let("col", ix.mul(ix.mod(c, per_row), CHUNK))
            gr, gc = ix.add(row0, row), ix.add(col0, col)
            ok = ix.both(ix.lt(gr, i32(n_rows)), ix.lt(gc, i32(n_cols)))
            at = ix.add(base, ix.add(ix.mul(ix.minimum(gr, i32(n_rows - 1)), n_cols),
                                     ix.minimum(gc, i32(n_cols - CHUNK))))
            slot = ix.add(stage_words, ix.add(ix.mul(row, pitch), ix.div(col, 2)))
            kb.copy_async(dst, slot, src, at, ok)

    def _issue(self, stage, kt):
        """The copies of K step kt into shared stage `stage` (no commit)."""
        sc, p, kb = self.sc, self.p, self.kb
        k0 = kb.let("k0", ix.mul(kt, sc.bk))
        self._copy(self.sa, ix.mul(stage, sc.bm * self.a_pitch), self.src_a, self.a_base,
                   sc.bm, sc.bk, self.a_pitch, self.m0, k0, p.m, p.k)
        w_stage = ix.mul(stage, self.w_rows * self.w_pitch)
        if self.k_major:
            self._copy(self.sw, w_stage, self.src_w, self.w_base, sc.bn, sc.bk, self.w_pitch,
                       self.n0, k0, p.n, p.k)
        else:
            self._copy(self.sw, w_stage, self.src_w, self.w_base, sc.bk, sc.bn, self.w_pitch,
                       k0, self.n0, p.k, p.n)

    def prologue(self, k_tiles: int) -> None:
        for s in range(self.sc.stages - 1):
            if s < k_tiles:
                self._issue(i32(s), i32(s))
            self.kb.copy_commit()            # empty batches keep the wait count uniform

    def step(self, kt, k_tiles: int) -> None:
        """Wait for step kt's copies, barrier (they are visible, and every warp is done
        with the stage the next copies overwrite), issue the step stages - 1 ahead."""
        kb, stages = self.kb, self.sc.stages
        kb.copy_wait(stages - 2)
        kb.barrier()
        ahead = ix.add(kt, stages - 1)
        with kb.if_(ix.lt(ahead, i32(k_tiles))):
            self._issue(ix.mod(ahead, stages), ahead)
        kb.copy_commit()


def split_unit(p) -> int | None:
    """Weight elements `SplitTiles` decodes at once for `p` (a run, or a 16-bit pair), or
    None when it cannot compute p's operands."""
    if p.w_per_row or p.acc is not F32 or p.k % 2:
        return None
    if p.w_run is not None and p.run > 1:
        return p.run if p.run % 2 == 0 and p.k % p.run == 0 else None
    # a packed format without runs decodes element by element (its decode_expr); dense
    # weights split exactly only when 16-bit
    return 2 if p.w_pair is not None or p.w_run is not None else None


def w_values(p, b, n, k, unit: int) -> list[Expr]:
    """W[n, k : k + unit] as F32 expressions (`unit` from `split_unit`, or 2)."""
    if p.w_pair is not None:
        return list(p.w_pair(b, n, ix.div(k, 2)))
    if unit == 2:                       # pairs of a packed weight
        return [p.w(b, None, n, ix.add(k, i)) for i in range(2)]
    out = []
    for part in p.w_run(b, None, n, k):
        for v, e in zip(part.values, part.exponents or [0] * len(part.values), strict=True):
            v = v if e == 0 else v * Const(2.0 ** e, F32)
            v = v if part.scale is None else part.scale * v
            out.append(v if part.offset is None else v + part.offset)
    return out


def w_unit(sc, p) -> int | None:
    """The weight chunk of `split_unit`, but pairs of elements (the format's decode_expr)
    where whole runs would leave threads of a step without one: a run is the longest
    chain of a step's work."""
    unit = split_unit(p)
    if unit is not None and unit > 2 and sc.bn * sc.bk // unit < sc.threads:
        return 2
    return unit


class SplitTiles(_Layout):
    """Operands computed in registers and stored as hi and lo bf16 parts (module doc).
    Thread t computes chunks t, t + threads, ... of each tile per step: a chunk is `unit`
    consecutive elements along K of one row (A: pairs; W: `w_unit`), consecutive
    threads taking consecutive chunks of a row (threads past the last chunk idle). Rows
    past the operand's and K past its end are zeros (their loads clamped in range)."""

    dtype = DType.BF16

    def __init__(self, kb, sc, p, b, m0, n0, tid):
        super().__init__(kb, sc, 2, True)
        self.kb, self.sc, self.p = kb, sc, p
        self.unit = w_unit(sc, p)
        self.k0 = kb.var("kh", i32(0))          # the K step whose loads the registers hold
        self.a_chunks = self._chunks(sc.bm, 2, m0, p.m, tid)
        self.w_chunks = self._chunks(sc.bn, self.unit, n0, p.n, tid)
        values = [v for rc in self.a_chunks for v in self._a_values(b, *rc)] + \
                 [v for rc in self.w_chunks for v in self._w_values(b, *rc)]
        self.values, self.reload = kb.hold("ld", values)

    @staticmethod
    def fits(sc, p) -> bool:
        unit = w_unit(sc, p)
        return unit is not None and sc.bk % unit == 0

    def _chunks(self, rows: int, unit: int, row0, limit: int, tid):
        """Per chunk: (tile row, column in the step, row clamped into the operand, row in
        the operand, chunk in the tile: None when every thread's is)."""
        kb, per_row, threads = self.kb, self.sc.bk // unit, self.sc.threads
        count, out = rows * per_row, []
        for u in range(-(-count // threads)):
            c = ix.add(tid, threads * u)
            valid = ix.lt(c, i32(count)) if threads * (u + 1) > count else None
            if valid is not None:
                c = kb.let("ch", ix.minimum(c, i32(count - 1)))
            row = kb.let("row", ix.div(c, per_row))
            col = kb.let("col", ix.mul(ix.mod(c, per_row), unit))
            g = ix.add(row0, row)
            out.append((row, col, kb.let("rc", ix.minimum(g, i32(limit - 1))),
                        ix.lt(g, i32(limit)), valid))
        return out

    def _k(self, col, unit: int):
        return ix.minimum(ix.add(self.k0, col), i32(self.p.k - unit))

    def _a_values(self, b, row, col, rc, ok, valid):
        k = self._k(col, 2)
        return [self.p.a(b, rc, ix.add(k, i)) for i in range(2)]

    def _w_values(self, b, row, col, rc, ok, valid):
        return w_values(self.p, b, rc, self._k(col, self.unit), self.unit)

    def prologue(self, k_tiles: int) -> None:
        """Nothing: the constructor read step 0 into the registers."""

    def step(self, kt, k_tiles: int) -> None:
        """Store the held step kt into its stage (the stage last read at step kt - 2, which
        every warp left before step kt - 1's barrier), read step kt + 1 (the last step
        again at the end: in range, unused), barrier."""
        kb, sc, p = self.kb, self.sc, self.p
        stage = ix.mod(kt, sc.stages)
        values = kb.let_shared("w", self.values)
        at = 0
        for tile, pitch, rows, chunks, unit in (
                (self.sa, self.a_pitch, sc.bm, self.a_chunks, 2),
                (self.sw, self.w_pitch, sc.bn, self.w_chunks, self.unit)):
            for row, col, _, ok, valid in chunks:
                xs = values[at:at + unit]
                at += unit
                with contextlib.ExitStack() as idle:
                    if valid is not None:       # a thread past the last chunk stores none
                        idle.enter_context(kb.if_(valid))
                    ok = kb.let("ok", ix.both(ok, ix.lt(ix.add(self.k0, col), i32(p.k))))
                    for part in range(2):
                        first = ix.mul(ix.add(ix.mul(stage, 2), part), rows)
                        base = kb.let("at", ix.add(ix.mul(ix.add(first, row), pitch),
                                                   ix.div(col, 2)))
                        for i in range(unit // 2):
                            word = pack(xs[2 * i], xs[2 * i + 1], part)
                            kb.store(tile, ix.add(base, i), Sel(ok, word, u32(0)))
        kb.assign(self.k0, ix.mul(ix.minimum(ix.add(kt, 1), i32(k_tiles - 1)), sc.bk))
        self.reload()
        kb.barrier()


def pack(x0: Expr, x1: Expr, part: int) -> Expr:
    """The bf16 word of (x0, x1)'s hi (part 0) or lo (part 1) parts."""
    bits = []
    for x in (x0, x1):
        hi = bf16_bits(x)
        bits.append(bf16_bits(x - hi.bitcast(F32)) if part else hi)
    return (bits[0] >> u32(16)) | bits[1]


def bf16_bits(x: Expr) -> Expr:
    """The f32 bits of x rounded to the nearest bf16 (halfway cases away from zero; finite
    values within 2^-9 of the largest f32 round to infinity)."""
    return (x.bitcast(U32) + u32(HALF)) & u32(HIGH)
