"""Data lowerings: Gather, ScatterUpdate, DynamicUpdateSlice (and TransposedUpdateSlice, its
block read from values holding the update axis first), ArgTopK."""
from __future__ import annotations

from poot.codegen import index as ix
from poot.codegen.expr import Expr, Load, ge, i32, maximum, select
from poot.codegen.lower.base import Sig, lowers
from poot.codegen.lower.pointwise import WORKGROUP, pointwise_kernel
from poot.codegen.lower.reduce import row_workgroups
from poot.codegen.program import SCRATCH, Access, BufferParam, KernelProgram, local_index
from poot.dtypes import DType
from poot.ir.ops import (
    ArgTopK,
    DynamicUpdateSlice,
    Gather,
    ScatterUpdate,
    TransposedUpdateSlice,
)
from poot.ir.ops.reduce import ReduceOp
from poot.ir.types import TensorType

F32, I32, U32 = DType.F32, DType.I32, DType.U32


@lowers(Gather)
def lower_gather(sig: Sig) -> KernelProgram:
    src, idx = sig.type(0), sig.type(1)
    a = sig.op.norm_axis(sig.op.axis, src.rank)

    def value(c, kb):
        j = kb.let("j", Load("in1", ix.ravel(c[a:a + idx.rank], idx.shape), idx.dtype))
        # indices are checked at bind time; the clamp keeps a bad one inside the buffer
        inner = list(c[:a]) + [ix.clamp(j, 0, src.shape[a] - 1)] + list(c[a + idx.rank:])
        return Load("in0", ix.ravel(inner, src.shape), src.dtype)
    return pointwise_kernel(sig, value)


def _update_kernel(sig: Sig, count: int, name: str):
    grid, flat = ix.launch_1d(count, WORKGROUP)
    kb = sig.builder(grid, (WORKGROUP,), name)
    sig.declare_inputs(kb)
    sig.declare_out(kb, Access.READ_WRITE)
    i = kb.let("i", flat)
    return kb, i


@lowers(ScatterUpdate)
def lower_scatter_update(sig: Sig) -> KernelProgram:
    src = sig.type(1)
    return scatter_rows(sig, 2, lambda kb, i: Load("in1", i, src.dtype))


def scatter_rows(sig: Sig, slots: int, value) -> KernelProgram:
    """In place on the donated base (operand 0): only the source rows are written, row t
    to the base's row in{slots}[t] (one row per slot entry); `value(kb, i)` is the
    source's flat element i."""
    base = sig.type(0)
    rows = sig.type(slots).shape[0]
    row = base.size // max(base.shape[0], 1)
    count = rows * row
    kb, i = _update_kernel(sig, count, "")
    with kb.if_(ix.lt(i, i32(count))):
        t = kb.let("t", ix.div(i, row))
        e = kb.let("e", ix.mod(i, row))
        slot = kb.let("slot", Load(f"in{slots}", t, sig.type(slots).dtype))
        # a later row naming the same slot wins: an earlier one steps aside
        later = kb.var("overwritten", i32(0))
        with kb.for_("u", ix.add(t, 1), rows) as u:
            kb.assign(later, later | ix.eq(Load(f"in{slots}", u, sig.type(slots).dtype), slot))
        ok = ix.both(ix.both(ge(slot, i32(0)), ix.lt(slot, i32(base.shape[0]))),
                     ix.eq(later, i32(0)))
        with kb.if_(ok):
            kb.store("out", ix.add(ix.mul(slot, row), e), value(kb, i))
    return KernelProgram((kb.finish(),), alias=0)


@lowers(DynamicUpdateSlice)
def lower_dynamic_update_slice(sig: Sig) -> KernelProgram:
    upd = sig.type(1)
    return update_block(sig, upd, 2, lambda kb, i: Load("in1", i, upd.dtype))


def in_order(kb, i, upd: TensorType, order: tuple[int, ...]):
    """Where block element i (flat, row-major in `upd`) lies among the elements of an
    operand holding the block's axes in `order` (i itself where that is the block's)."""
    if order == tuple(range(upd.rank)):
        return i
    c = ix.unravel(i, upd.shape)
    return kb.let("xi", ix.ravel([c[a] for a in order], [upd.shape[a] for a in order]))


@lowers(TransposedUpdateSlice)
def lower_transposed_update_slice(sig: Sig) -> KernelProgram:
    base, x = sig.type(0), sig.type(1)
    upd = sig.op.update_type(base, x)
    order = sig.op.token_order(upd.shape)

    def value(kb, i):
        y = Load("in1", in_order(kb, i, upd, order), x.dtype)
        return y if x.dtype == base.dtype else y.cast(base.dtype)
    return update_block(sig, upd, 2, value)


def update_block(sig: Sig, upd: TensorType, index: int, value) -> KernelProgram:
    """In place on the donated base (operand 0): only the block `upd` is written, at
    in{index} along the op's axis (clamped so the block stays inside); `value(kb, i)` is
    the block's flat element i."""
    op_t = sig.type(0)
    a = sig.op.norm_axis(sig.op.axis, op_t.rank)
    kb, i = _update_kernel(sig, upd.size, "")
    with kb.if_(ix.lt(i, i32(upd.size))):
        start = kb.let("start", ix.clamp(Load(f"in{index}", i32(0), sig.type(index).dtype), 0,
                                         op_t.shape[a] - upd.shape[a]))
        c = ix.unravel(i, upd.shape)
        c[a] = ix.add(c[a], start)
        kb.store("out", ix.ravel(c, op_t.shape), value(kb, i))
    return KernelProgram((kb.finish(),), alias=0)


#: the largest k the one-pass ArgTopK keeps per thread (a larger k ranks by counting)
SMALL_K = 64
INT_MIN, INT_MAX = -(2 ** 31), 2 ** 31 - 1


def order_key(x: Expr) -> Expr:
    """An I32 whose signed order is ArgTopK's order of `x`: floats by value (-0 equal to +0,
    NaN below everything), integers by value."""
    if x.dtype.is_float:
        b = x.cast(F32).bitcast(I32)
        mag = b & i32(INT_MAX)
        key = select(ge(b, i32(0)), b, b ^ i32(INT_MAX))
        key = select(ge(i32(0), mag), i32(0), key)
        return select(ge(mag, i32(0x7F800001)), i32(INT_MIN + 1), key)
    if x.dtype is U32:
        return x.bitcast(I32) ^ i32(INT_MIN)
    return x.cast(I32)


def _before(key: Expr, idx: Expr, other_key: Expr, other_idx: Expr) -> Expr:
    """1 where (key, idx) ranks before (other_key, other_idx): larger key, or equal and
    lower index."""
    return ix.lt(other_key, key) | ix.both(ix.eq(key, other_key), ix.lt(idx, other_idx))


#: elements each thread of the k = 1 ArgTopK loads before it compares any of them
ARGMAX_TRIP = 16
#: elements per workgroup of the first of a split argmax's two kernels
ARGMAX_PART = 2048


@lowers(ArgTopK)
def lower_argtopk(sig: Sig) -> KernelProgram:
    if sig.op.k == 1:
        return _argmax(sig)
    return _argtopk_one_pass(sig) if sig.op.k <= SMALL_K else _argtopk_counting(sig)


def _argmax(sig: Sig) -> KernelProgram:
    """k = 1 (greedy sampling over a vocabulary). Each thread folds its strided elements
    ARGMAX_TRIP loads at a time, all issued before the first compare (the one-pass top-k
    kernel's insertion after every load left one L2 round trip per element; figures in
    docs/performance.md), and keeps the first of equal keys; then the workgroup's
    largest key and the lowest index holding it. Rows of at least two ARGMAX_PART are
    split: one workgroup per part stores its best (key, index) to scratch, then one
    workgroup per row picks among the parts' (a single workgroup reading a whole row is
    bound by one SM's loads)."""
    x = sig.type(0)
    e_count = x.shape[-1]
    rows = x.size // max(e_count, 1)
    parts = -(-e_count // ARGMAX_PART) if e_count >= 2 * ARGMAX_PART else 1

    def element(base, index, limit):
        """(order key, index) of row element `index`; the lowest key at or past limit."""
        live = ix.lt(index, i32(limit))
        key = order_key(Load("in0", ix.add(base, ix.minimum(index, i32(limit - 1))), x.dtype))
        return select(live, key, i32(INT_MIN)), index

    if parts == 1:
        kb, wg, r = row_workgroups(sig, rows, e_count)
        with kb.if_(ix.lt(r, i32(rows))):  # whole workgroups in or out: uniform
            base = kb.let("base", ix.mul(r, e_count))
            best, at = _fold_best(kb, e_count, wg, lambda j: element(base, j, e_count))
            _store_best(kb, best, at, r)
        return KernelProgram((kb.finish(),))
    pairs = rows * parts
    scratch = (BufferParam("best_key", I32, Access.READ_WRITE, pairs, SCRATCH),
               BufferParam("best_at", I32, Access.READ_WRITE, pairs, SCRATCH))
    wg = WORKGROUP
    grid, g = ix.launch_groups(pairs)
    kb = sig.builder(grid, (wg,))
    sig.declare_inputs(kb)
    for b in scratch:
        kb.buffer(b.name, I32, Access.WRITE, pairs, SCRATCH)
    rp = kb.let("rp", g)
    with kb.if_(ix.lt(rp, i32(pairs))):
        base = kb.let("base", ix.mul(ix.div(rp, parts), e_count))
        first = kb.let("first", ix.mul(ix.mod(rp, parts), ARGMAX_PART))
        best, at = _fold_best(kb, ARGMAX_PART, wg,
                              lambda j: element(base, ix.add(first, j), e_count))
        _store_best(kb, best, at, rp, ("best_key", "best_at"))
    first_kernel = kb.finish()
    wg = ix.pow2_at_least(parts)
    grid, row = ix.launch_groups(rows)
    kb = sig.builder(grid, (wg,), "_pick")
    sig.declare_out(kb)
    for b in scratch:
        kb.buffer(b.name, I32, Access.READ, pairs, SCRATCH)
    r = kb.let("row", row)
    with kb.if_(ix.lt(r, i32(rows))):
        def part(j):
            spot = ix.add(ix.mul(r, parts), ix.minimum(j, i32(parts - 1)))
            live = ix.lt(j, i32(parts))
            return (select(live, Load("best_key", spot, I32), i32(INT_MIN)),
                    Load("best_at", spot, I32))
        best, at = _fold_best(kb, parts, wg, part)
        _store_best(kb, best, at, r)
    return KernelProgram((first_kernel, kb.finish()), scratch=scratch)


def _fold_best(kb, count: int, wg: int, element) -> tuple[Expr, Expr]:
    """This thread's best (key, index) of items j = lane, lane + wg, ... below `count`
    (`element(j)` gives an item's key and index, the lowest key where it is no item):
    loops of up to ARGMAX_TRIP loads, then their compares in order (ties keep the first)."""
    best, at = kb.var("best", i32(INT_MIN)), kb.var("at", i32(INT_MAX))
    trip = min(ARGMAX_TRIP, -(-count // wg))
    stride = wg * trip

    def fold(j0):
        items = []
        for u in range(trip):
            key, index = element(kb.let("j", ix.add(j0, ix.add(local_index(), u * wg))))
            items.append((kb.let("key", key), kb.let("at_j", index)))
        for key, index in items:
            better = kb.let("better", ix.lt(best, key))
            kb.assign(at, select(better, index, at))
            kb.assign(best, select(better, key, best))

    if count <= stride:
        fold(i32(0))
    else:
        with kb.for_("j0", 0, -(-count // stride) * stride, stride) as j0:
            fold(j0)
    return best, at


def _store_best(kb, best, at, spot, names=None) -> None:
    """The workgroup's largest key and the lowest index holding it, stored by thread 0:
    the index to `out` (names None), or key and index to the two scratch arrays."""
    top = kb.reduce("top", ReduceOp.Max, best)
    win = kb.reduce("win", ReduceOp.Max, select(ix.eq(best, top), -at, i32(INT_MIN)))
    with kb.if_(ix.eq(local_index(), i32(0))):
        if names is None:
            kb.store("out", spot, -win)
        else:
            kb.store(names[0], spot, top)
            kb.store(names[1], spot, -win)


def _argtopk_one_pass(sig: Sig) -> KernelProgram:
    """One workgroup per row, O(E) per row: each thread keeps the best k of its strided
    part of the row, sorted, in registers; then k rounds of a workgroup-wide reduction
    take the best head among the threads (largest key, then lowest index) and its thread
    moves on. The global top k lie among the threads' own top k."""
    x = sig.type(0)
    e_count, k = x.shape[-1], sig.op.k
    rows = x.size // max(e_count, 1)
    wg = ix.pow2_at_least(e_count)
    grid, row = ix.launch_groups(rows)
    kb = sig.builder(grid, (wg,))
    sig.declare_all(kb)
    r = kb.let("row", row)
    keys, ids = kb.local("best_key", I32, k), kb.local("best_idx", I32, k)
    with kb.if_(ix.lt(r, i32(rows))):  # whole workgroups in or out: uniform
        with kb.for_("p", 0, k) as p:
            kb.store(keys, p, i32(INT_MIN))
            kb.store(ids, p, i32(e_count))   # below every real element of equal key
        base = kb.let("base", ix.mul(r, e_count))
        floor = _threshold(kb, x, base, e_count, wg, k) if k > 1 else i32(INT_MIN)
        held = kb.var("held", i32(0))       # real entries in the thread's list
        with kb.for_("j", local_index(), e_count, wg) as j:
            key = kb.let("key", order_key(Load("in0", ix.add(base, j), x.dtype)))
            with kb.if_(ix.both(ge(key, floor), _before(key, j, keys[k - 1], ids[k - 1]))):
                # binary search for its place, then shift only the real entries below it
                # (most insertions land near the bottom of the list)
                last = kb.let("last", ix.minimum(held, i32(k - 1)))
                lo, hi = kb.var("lo", i32(0)), kb.var("hi", last)
                for _ in range(k.bit_length()):
                    with kb.if_(ix.lt(lo, hi)):
                        mid = kb.let("mid", (lo + hi) >> i32(1))
                        with kb.if_(_before(key, j, keys[mid], ids[mid])):
                            kb.assign(hi, mid)
                        with kb.else_():
                            kb.assign(lo, mid + i32(1))
                with kb.for_("q", 0, ix.sub(last, lo)) as q:
                    p = kb.let("p", ix.sub(last, q))
                    kb.store(keys, p, keys[ix.sub(p, i32(1))])
                    kb.store(ids, p, ids[ix.sub(p, i32(1))])
                kb.store(keys, lo, key)
                kb.store(ids, lo, j)
                kb.assign(held, ix.minimum(held + i32(1), i32(k)))
        head = kb.var("head", i32(0))
        with kb.for_("t", 0, k) as t:
            live = kb.let("live", ix.lt(head, i32(k)))
            hc = ix.clamp(head, 0, k - 1)
            hkey = kb.let("hkey", select(live, keys[hc], i32(INT_MIN)))
            hidx = kb.let("hidx", select(live, ids[hc], i32(e_count)))
            best = kb.reduce("best", ReduceOp.Max, hkey)
            mine = kb.let("mine", ix.eq(hkey, best))
            win = kb.reduce("win", ReduceOp.Max, select(mine, -hidx, i32(INT_MIN)))
            with kb.if_(ix.eq(local_index(), i32(0))):
                kb.store("out", ix.add(ix.mul(r, k), t), -win)
            kb.assign(head, head + ix.both(mine, ix.eq(hidx, -win)))
    return KernelProgram((kb.finish(),))


def _threshold(kb, x, base, e_count: int, wg: int, k: int) -> Expr:
    """A key no larger than the row's k-th largest: the k-th largest of the threads' own
    maxima (k distinct elements reach it). Elements below it are never inserted, so the
    lists see a few times k insertions instead of nearly every element."""
    top = kb.var("top", i32(INT_MIN))
    with kb.for_("j", local_index(), e_count, wg) as j:
        kb.assign(top, maximum(top, order_key(Load("in0", ix.add(base, j), x.dtype))))
    floor = kb.var("floor", i32(INT_MIN))
    with kb.for_("t", 0, k):
        best = kb.reduce("round_max", ReduceOp.Max, top)
        kb.assign(floor, best)
        # every thread holding this maximum drops out: the floor can only get lower
        kb.assign(top, select(ix.eq(top, best), i32(INT_MIN), top))
    return floor


def _argtopk_counting(sig: Sig) -> KernelProgram:
    """Rank by counting: element e of a row goes to place #{e' before it in the order}
    (larger first, ties to the lower index); places below k are written. Each place
    is taken by exactly one element, so no two threads write one output."""
    x = sig.type(0)
    e_count, k = x.shape[-1], sig.op.k
    grid, flat = ix.launch_1d(x.size, WORKGROUP)
    kb = sig.builder(grid, (WORKGROUP,))
    sig.declare_inputs(kb)
    sig.declare_out(kb)
    i = kb.let("i", flat)
    with kb.if_(ix.lt(i, i32(x.size))):
        r = kb.let("r", ix.div(i, e_count))
        e = kb.let("e", ix.mod(i, e_count))
        mine = kb.let("mine", Load("in0", i, x.dtype))
        place = kb.var("place", i32(0))
        with kb.for_("j", 0, e_count) as j:
            other = Load("in0", ix.add(ix.mul(r, e_count), j), x.dtype)
            above = ix.lt(mine, other)
            tie_before = ix.both(ix.eq(other, mine), ix.lt(j, e))
            kb.assign(place, place + (above | tie_before))
        with kb.if_(ix.lt(place, i32(k))):
            kb.store("out", ix.add(ix.mul(r, k), place), e)
    return KernelProgram((kb.finish(),))

