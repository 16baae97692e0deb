"""Block-sparse attention: BlockTopK (choose key blocks) and SelectedAttention (attend
over them).

* BlockTopK: three kernels, each one thread per result element. The block sums of the
  keys and the query-block scores are each rounded to the operands' dtype, as the
  definition's Reduce and MatMul round, so the ranking sees the definition's ties;
  then rank by counting (larger first, ties to the lower block, NaN last).
* SelectedAttention: a 32-lane group owns a query row (attention's `_Row`: online
  softmax, lanes split the head dim) and reads only the keys of the blocks listed for
  it. A listed block that repeats an earlier one, or names no block, adds no keys.
"""
from __future__ import annotations

import math

from poot.codegen import index as ix
from poot.codegen.expr import Bin, Const, Expr, Load, ge, i32, u32
from poot.codegen.lower.attention import KEYS, LANES, NEG_INF, WARPS, Row, Shape
from poot.codegen.lower.base import Sig, lowers
from poot.codegen.lower.pointwise import WORKGROUP
from poot.codegen.program import SCRATCH, Access, BufferParam, KernelProgram, local_index
from poot.dtypes import DType
from poot.errors import UnsupportedOp
from poot.ir.ops import BinaryOp, BlockTopK, SelectedAttention

F32, U32 = DType.F32, DType.U32


def _rounded(x: Expr, dtype: DType) -> Expr:
    """An F32 value rounded to `dtype` and widened back (the definition's rounding)."""
    return x if dtype is F32 else x.cast(dtype).cast(F32)


def _is_nan(x: Expr) -> Expr:
    """1 where the F32 `x` is NaN, tested on its bits (finite-math compilers may fold
    x != x away)."""
    mag = Bin(BinaryOp.And, x.bitcast(U32), u32(0x7FFFFFFF))
    return Bin(BinaryOp.GeU, mag, u32(0x7F800001))


def _thread_kernel(sig: Sig, count: int, suffix: str):
    grid, flat = ix.launch_1d(count, WORKGROUP)
    kb = sig.builder(grid, (WORKGROUP,), suffix)
    return kb, kb.let("i", flat)


@lowers(BlockTopK)
def lower_block_topk(sig: Sig) -> KernelProgram:
    q, k = sig.type(0), sig.type(1)
    h, t, d = q.shape
    s, block, top = k.shape[1], sig.op.block, sig.op.k
    nb = s // block
    pooled = BufferParam("pooled", F32, Access.READ_WRITE, h * nb * d, SCRATCH)
    scores = BufferParam("scores", F32, Access.READ_WRITE, h * t * nb, SCRATCH)

    # the sum of each block of keys: [H, NB, D]
    kb, i = _thread_kernel(sig, pooled.count, "_pool")
    sig.declare_input(kb, 1)
    kb.buffer("pooled", F32, Access.WRITE, pooled.count, SCRATCH)
    with kb.if_(ix.lt(i, i32(pooled.count))):
        row, dd = kb.let("row", ix.div(i, d)), kb.let("dd", ix.mod(i, d))
        acc = kb.var("acc", Const(0.0, F32))
        with kb.for_("b", 0, block) as b:
            key_row = ix.add(ix.mul(row, block), b)       # [H, S] rows are [H, NB, block]
            kb.assign(acc, acc + Load("in1", ix.add(ix.mul(key_row, d), dd), k.dtype).cast(F32))
        kb.store("pooled", i, _rounded(acc, k.dtype))
    pool = kb.finish()

    # each query against each block sum: [H, T, NB]
    kb, i = _thread_kernel(sig, scores.count, "_score")
    sig.declare_input(kb, 0)
    kb.buffer("pooled", F32, Access.READ, pooled.count, SCRATCH)
    kb.buffer("scores", F32, Access.WRITE, scores.count, SCRATCH)
    with kb.if_(ix.lt(i, i32(scores.count))):
        qrow = kb.let("qrow", ix.div(i, nb))              # h * T + t
        hb = kb.let("hb", ix.add(ix.mul(ix.div(qrow, t), nb), ix.mod(i, nb)))   # h * NB + b
        acc = kb.var("acc", Const(0.0, F32))
        with kb.for_("j", 0, d) as j:
            qv = Load("in0", ix.add(ix.mul(qrow, d), j), q.dtype).cast(F32)
            kb.assign(acc, acc + qv * Load("pooled", ix.add(ix.mul(hb, d), j), F32))
        kb.store("scores", i, _rounded(acc, q.dtype))
    score = kb.finish()

    # rank by counting: each block's place among its row's; places below k are written
    kb, i = _thread_kernel(sig, scores.count, "_rank")
    kb.buffer("scores", F32, Access.READ, scores.count, SCRATCH)
    sig.declare_out(kb)
    with kb.if_(ix.lt(i, i32(scores.count))):
        qrow, e = kb.let("qrow", ix.div(i, nb)), kb.let("e", ix.mod(i, nb))

        def key(x: Expr):      # NaN sorts as -inf, after every -inf that is not NaN
            nan = kb.let("nan", _is_nan(x))
            return kb.let("key", ix.Sel(nan, NEG_INF, x)), nan

        mine, mine_nan = key(kb.let("mine", Load("scores", i, F32)))
        place = kb.var("place", i32(0))
        with kb.for_("j", 0, nb) as j:
            other, other_nan = key(kb.let("other", Load("scores", ix.add(ix.mul(qrow, nb), j),
                                                        F32)))
            tie = ix.both(ix.eq(other, mine), ix.lt(other_nan, mine_nan)
                          | ix.both(ix.eq(other_nan, mine_nan), ix.lt(j, e)))
            kb.assign(place, place + (ix.lt(mine, other) | tie))
        with kb.if_(ix.lt(place, i32(top))):
            kb.store("out", ix.add(ix.mul(qrow, top), place), e)
    return KernelProgram((pool, score, kb.finish()), scratch=(pooled, scores))


class _SelectedRow(Row):
    """A query row whose mask is SelectedAttention's [H, T, S]-broadcast mask (operand 4)."""

    def __init__(self, kb, a: Shape, lane, h, ti, row_ok):
        super().__init__(kb, a, lane, i32(0), h, ti, row_ok)
        self.h, self.ti = h, ti

    def mask_at(self, key):
        c = ix.broadcast_coords([self.h, self.ti, key], self.a.mask.shape)
        return Load("in4", ix.ravel(c, self.a.mask.shape), self.a.mask.dtype).cast(F32)


@lowers(SelectedAttention)
def lower_selected_attention(sig: Sig) -> KernelProgram:
    a = Shape(sig, mask=4)
    if a.mask.rank > 3:
        raise UnsupportedOp(f"SelectedAttention mask {a.mask} must broadcast to [H, T, S]",
                            op="SelectedAttention", dtype=str(a.q.dtype))
    block, listed = sig.op.block, sig.type(3).shape[2]
    nb = a.s // block
    rows = a.hq * a.t
    count = math.ceil(rows / WARPS)
    grid, g = ix.launch_groups(count)
    kb = sig.builder(grid, (LANES * WARPS,))
    sig.declare_all(kb)
    lane = kb.let("lane", ix.mod(local_index(), LANES))
    r = kb.let("r", ix.add(ix.mul(g, WARPS), ix.div(local_index(), LANES)))
    row_ok = kb.let("row_ok", ix.lt(r, i32(rows)))
    rc = kb.let("rc", ix.minimum(r, i32(rows - 1)))
    h, ti = kb.let("h", ix.div(rc, a.t)), kb.let("t", ix.mod(rc, a.t))
    row = _SelectedRow(kb, a, lane, h, ti, row_ok)
    kbase = kb.let("kbase", ix.mul(h, a.s * a.d))
    vbase = kb.let("vbase", ix.mul(h, a.s * a.dv))
    with kb.for_("j", 0, listed) as j:
        bid = kb.let("bid", Load("in3", ix.add(ix.mul(rc, listed), j), DType.I32))
        fresh = kb.var("fresh", ix.both(ge(bid, i32(0)), ix.lt(bid, i32(nb))))
        with kb.for_("p", 0, j) as p:       # a block listed twice is attended once
            earlier = Load("in3", ix.add(ix.mul(rc, listed), p), DType.I32)
            kb.assign(fresh, ix.both(fresh, Bin(BinaryOp.Xor, ix.eq(earlier, bid), i32(1))))
        first = kb.let("first", ix.mul(ix.clamp(bid, 0, nb - 1), block))
        with kb.for_("run", 0, block, KEYS) as run:
            rel = [ix.add(run, i) for i in range(KEYS)]
            keys = [kb.let("kc", ix.add(first, ix.minimum(x, i32(block - 1)))) for x in rel]
            row.run(keys, [ix.both(fresh, ix.lt(x, i32(block))) for x in rel],
                    lambda i, dk: Load("in1", ix.add(kbase, ix.add(ix.mul(keys[i], a.d), dk)),
                                       a.k.dtype).cast(F32),
                    lambda i, dvj: Load("in2", ix.add(vbase, ix.add(ix.mul(keys[i], a.dv),
                                                                    dvj)), a.v.dtype).cast(F32))
    with kb.if_(row_ok):
        obase = ix.mul(rc, a.dv)
        with kb.for_("jo", 0, a.vj) as jo:
            dd = kb.let("dd", ix.add(lane, ix.mul(jo, LANES)))
            with kb.if_(ix.lt(dd, i32(a.dv))):
                kb.store("out", ix.add(obase, dd), (row.acc[jo] / row.lsum).cast(sig.out.dtype))
    return KernelProgram((kb.finish(),))
