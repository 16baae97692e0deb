"""The tiled GEMM (many rows on a target without tensor cores, e.g. prefill): 16x16
output tiles, operands staged through shared memory tiles of 16 along K (widened to the
accumulator type)."""
from __future__ import annotations

from poot.codegen import index as ix
from poot.codegen.expr import Sel, i32
from poot.codegen.lower.problem import Problem
from poot.codegen.program import group_id, local_id, local_index

TILE = 16         # the tile edge: 16 x 16 threads a workgroup


def gemm_kernel(p: Problem, kb_factory, declare):
    """16x16 threads, each computing R x R outputs (rows ty + 16i, columns tx + 16j) of a
    16R x 16R tile; operands staged through shared tiles of 16 along K, rows padded to 17
    words so the threads of a warp read distinct banks. R = 4 once M fills the tile."""
    r = 4 if p.m >= 4 * TILE else 1
    edge, pitch = TILE * r, TILE + 1
    grid = (-(-p.n // edge), -(-p.m // edge), p.batch)
    kb = kb_factory(grid, (TILE, TILE))
    declare(kb)
    sa = kb.shared("tile_a", p.acc, edge * pitch)
    sw = kb.shared("tile_w", p.acc, edge * pitch)
    tx, ty, b = local_id(0), local_id(1), group_id(2)
    m0 = kb.let("m0", ix.mul(group_id(1), edge))
    n0 = kb.let("n0", ix.mul(group_id(0), edge))
    accs = [[kb.var("acc", p.zero()) for _ in range(r)] for _ in range(r)]
    with kb.for_("k0", 0, p.k, TILE) as k0:
        for u in range(r):   # each thread stages r elements of each tile, coalesced along K
            e = ix.add(local_index(), TILE * TILE * u)
            row, kk = kb.let("row", ix.div(e, TILE)), kb.let("kk", ix.mod(e, TILE))
            k = kb.let("k", ix.add(k0, kk))
            kc = ix.minimum(k, i32(p.k - 1))
            slot = ix.add(ix.mul(row, pitch), kk)
            for tile, base, size, value in ((sa, m0, p.m, lambda x, kc=kc: p.a(b, x, kc)),
                                            (sw, n0, p.n, lambda x, kc=kc: p.w(b, None, x, kc))):
                at = ix.add(base, row)
                ok = ix.both(ix.lt(at, i32(size)), ix.lt(k, i32(p.k)))
                kb.store(tile, slot, Sel(ok, value(ix.minimum(at, i32(size - 1))), p.zero()))
        kb.barrier()
        with kb.for_("j", 0, TILE) as j:
            a_vals = [kb.let("a", sa[ix.add(ix.mul(ix.add(ty, TILE * i), pitch), j)])
                      for i in range(r)]
            w_vals = [kb.let("w", sw[ix.add(ix.mul(ix.add(tx, TILE * jj), pitch), j)])
                      for jj in range(r)]
            for i in range(r):
                for jj in range(r):
                    kb.assign(accs[i][jj], accs[i][jj] + a_vals[i] * w_vals[jj])
        kb.barrier()
    for i in range(r):
        for jj in range(r):
            m = kb.let("m", ix.add(m0, ix.add(ty, TILE * i)))
            n = kb.let("n", ix.add(n0, ix.add(tx, TILE * jj)))
            with kb.if_(ix.both(ix.lt(m, i32(p.m)), ix.lt(n, i32(p.n)))):
                p.store(kb, b, m, n, accs[i][jj])
    return kb.finish()
