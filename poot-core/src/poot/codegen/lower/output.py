"""How contraction kernels write their results: the flat store most problems use; one
lane's part of a tensor-core accumulator tile through any problem's store; and a warp's
16-row block of such tiles staged through shared memory so that each lane stores 16
bytes of one row at a time (`store_block`)."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from poot.codegen import index as ix
from poot.codegen.expr import Expr, i32
from poot.codegen.target import MMA_M16N8K16
from poot.dtypes import DType


@dataclass(frozen=True)
class FlatStore:
    """Stores out[(b*M + m)*N + n] = acc cast to the output dtype, through `epilogue`
    (flat index, acc) -> value when given; called as a Problem's `store`."""

    dtype: DType
    m: int
    n: int
    epilogue: Callable | None = None

    def at(self, kb, b, m, n):
        """The flat index of out[b, m, n], bound to a variable."""
        return kb.let("o", ix.add(ix.mul(ix.add(ix.mul(b, self.m), m), self.n), n))

    def value(self, kb, idx, acc):
        """What out[idx] receives for the accumulator `acc`."""
        return acc.cast(self.dtype) if self.epilogue is None else self.epilogue(kb, idx, acc)

    def __call__(self, kb, b, m, n, acc):
        idx = self.at(kb, b, m, n)
        kb.store("out", idx, self.value(kb, idx, acc))

    def widens(self, count: int) -> bool:
        """Whether `wide` may store `count` columns at once: N a multiple of it, 4 to 16
        bytes in all."""
        return self.n % count == 0 and count * self.dtype.itemsize in (4, 8, 16)

    def wide(self, kb, b, m, n, accs):
        """Columns n .. n + len(accs) - 1 (n a multiple of their count; `widens` holds) in
        one StoreWide (the caller's target has WIDE_LOADS)."""
        idx = self.at(kb, b, m, n)
        kb.store_wide("out", idx, [self.value(kb, ix.add(idx, i), a)
                                   for i, a in enumerate(accs)])


def store_flat(sig, m_count: int, n_count: int, epilogue=None) -> FlatStore:
    return FlatStore(sig.out.dtype, m_count, n_count, epilogue)


def store_fragment(kb, p, b, m, n, values: list[Expr], wide: bool) -> None:
    """One lane's four values of a 16 x 8 accumulator tile (MMA_M16N8K16's layout: rows m
    and m + 8, columns n and n + 1; n even) through `p.store`, rows past M and columns past
    N skipped. With `wide` (the target has WIDE_LOADS) and a FlatStore over an even N, each
    row's two columns go in one store: half the store instructions, whole 32-bit words."""
    pairs = wide and isinstance(p.store, FlatStore) and p.store.widens(2)
    for r in range(0, 4, 2 if pairs else 1):
        dr, dc = MMA_M16N8K16.coords(0, r)
        row = kb.let("m", ix.add(m, dr))
        col = kb.let("n", ix.add(n, dc))
        with kb.if_(ix.both(ix.lt(row, i32(p.m)), ix.lt(col, i32(p.n)))):
            if pairs:                   # n even and N even: n + 1 < N as well
                p.store.wide(kb, b, row, col, values[r:r + 2])
            else:
                p.store(kb, b, row, col, values[r])


ROWS = 16           # rows of a warp's block: one accumulator tile's (MMA_M16N8K16)
SEGMENT = 16        # bytes a lane stores at once from the staged block
ROW_BYTES = 128     # bytes of each row a warp stages at once (one chunk)


@dataclass(frozen=True)
class Staging:
    """The shared rows `store_block` stages a warp's block through: `array` holds every
    warp's 16 padded rows of `chunk` columns, this warp's the `warp`-th."""

    array: object
    warp: Expr
    chunk: int


def staged_columns(p, columns: int, wide: bool) -> int:
    """Columns of a warp's block (`columns` wide) staged at once by `store_block`, or 0
    where it stores each tile directly: staging needs WIDE_LOADS, a FlatStore of 16- or
    32-bit elements over N in whole 16-byte segments, and `columns` in whole chunks."""
    if not (wide and isinstance(p.store, FlatStore)) or p.store.dtype.itemsize not in (2, 4):
        return 0
    size = p.store.dtype.itemsize
    seg, chunk = SEGMENT // size, min(columns, ROW_BYTES // size)
    lanes = MMA_M16N8K16.lanes
    ok = p.n % seg == 0 and columns % chunk == 0 and (ROWS * chunk // seg) % lanes == 0
    return chunk if ok else 0


def staging(kb, p, columns: int, warps: int, warp: Expr, wide: bool) -> Staging | None:
    """The shared rows for `warps` warps whose blocks are `columns` wide (`warp`: this
    thread's warp among them), or None where the blocks are stored directly."""
    chunk = staged_columns(p, columns, wide)
    if not chunk:
        return None
    rows = warps * ROWS * (chunk + SEGMENT // p.store.dtype.itemsize)
    return Staging(kb.shared("stage_out", p.store.dtype, rows), kb.let("sw", warp), chunk)


def store_block(kb, p, b, m, n, lane, tiles: list[list[Expr]], wide: bool,
                staged: Staging | None = None) -> None:
    """A warp's 16-row block of accumulator tiles: tiles[j] the lane's four values (as
    `store_fragment` takes them) of the tile at rows m.., columns n + 8j.. (m, n the
    block's first row and column, `lane` the thread's lane in its warp). With `staged`
    (`staging`), its `chunk` columns at a time: each lane writes
    its values through the store's epilogue into the warp's rows in shared memory (a
    16-byte pad a row keeps the 32 lanes' 4-byte writes on distinct banks), the warp
    synchronizes, and each lane copies 16-byte row segments out, whole rows a store
    instead of eight rows' 4 bytes. Without, each tile goes by `store_fragment`."""
    quad, pair = kb.let("quad", ix.div(lane, 4)), kb.let("pair", ix.mul(ix.mod(lane, 4), 2))
    if staged is None:
        row = kb.let("mq", ix.add(m, quad))
        for j, values in enumerate(tiles):
            store_fragment(kb, p, b, row, kb.let("nj", ix.add(n, ix.add(pair, 8 * j))),
                           values, wide)
        return
    fs, lanes, stage, chunk = p.store, MMA_M16N8K16.lanes, staged.array, staged.chunk
    seg = SEGMENT // fs.dtype.itemsize
    pitch, per_row = chunk + seg, chunk // seg
    mine = kb.let("sb", ix.mul(staged.warp, ROWS * pitch))
    for c0 in range(0, 8 * len(tiles), chunk):
        for j in range(c0 // 8, (c0 + chunk) // 8):
            for r in (0, 2):
                dr, _ = MMA_M16N8K16.coords(0, r)
                row = kb.let("m", ix.add(m, ix.add(quad, dr)))
                col = kb.let("n", ix.add(n, ix.add(pair, 8 * j)))
                with kb.if_(ix.both(ix.lt(row, i32(p.m)), ix.lt(col, i32(p.n)))):
                    idx = fs.at(kb, b, row, col)
                    spot = ix.add(mine, ix.add(ix.mul(ix.add(quad, dr), pitch),
                                               ix.add(pair, 8 * j - c0)))
                    kb.store_wide(stage, spot, [fs.value(kb, ix.add(idx, i), tiles[j][r + i])
                                                for i in range(2)])
        kb.group_barrier(lanes)
        for s in range(ROWS * per_row // lanes):
            e = ix.add(lane, s * lanes)
            r, c = kb.let("sr", ix.div(e, per_row)), kb.let("sc", ix.mul(ix.mod(e, per_row), seg))
            row, col = kb.let("m", ix.add(m, r)), kb.let("n", ix.add(n, ix.add(c, c0)))
            with kb.if_(ix.both(ix.lt(row, i32(p.m)), ix.lt(col, i32(p.n)))):
                values = kb.load_wide("sv", stage, ix.add(mine, ix.add(ix.mul(r, pitch), c)),
                                      seg)
                kb.store_wide("out", fs.at(kb, b, row, col), values)
        kb.group_barrier(lanes)     # every lane's reads before the next chunk's writes
