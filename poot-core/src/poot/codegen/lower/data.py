"""Data lowerings: Gather, ScatterUpdate, DynamicUpdateSlice, ArgTopK."""
from __future__ import annotations

from poot.codegen import index as ix
from poot.codegen.expr import Load, ge, i32
from poot.codegen.lower.base import Sig, lowers
from poot.codegen.lower.pointwise import WORKGROUP, pointwise_kernel
from poot.codegen.program import Access, KernelProgram
from poot.ir.ops import ArgTopK, DynamicUpdateSlice, Gather, ScatterUpdate


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
    """In place on the donated base: only the N source rows are written."""
    base, src = sig.type(0), sig.type(1)
    rows, row = src.shape[0], src.size // max(src.shape[0], 1)
    kb, i = _update_kernel(sig, src.size, "")
    with kb.if_(ix.lt(i, i32(src.size))):
        t = kb.let("t", ix.div(i, row))
        e = kb.let("e", ix.mod(i, row))
        slot = kb.let("slot", Load("in2", t, sig.type(2).dtype))
        # a later row naming the same slot wins: an earlier one steps aside
        later = kb.var("overwritten", i32(0))
        with kb.for_("u", ix.add(t, 1), rows) as u:
            kb.assign(later, later | ix.eq(Load("in2", u, sig.type(2).dtype), slot))
        ok = ix.both(ix.both(ge(slot, i32(0)), ix.lt(slot, i32(base.shape[0]))),
                     ix.eq(later, i32(0)))
        with kb.if_(ok):
            kb.store("out", ix.add(ix.mul(slot, row), e), Load("in1", i, src.dtype))
    return KernelProgram((kb.finish(),), alias=0)


@lowers(DynamicUpdateSlice)
def lower_dynamic_update_slice(sig: Sig) -> KernelProgram:
    """In place on the donated operand: only the update's elements are written."""
    op_t, upd = sig.type(0), sig.type(1)
    a = sig.op.norm_axis(sig.op.axis, op_t.rank)
    kb, i = _update_kernel(sig, upd.size, "")
    with kb.if_(ix.lt(i, i32(upd.size))):
        start = kb.let("start", ix.clamp(Load("in2", i32(0), sig.type(2).dtype), 0,
                                         op_t.shape[a] - upd.shape[a]))
        c = ix.unravel(i, upd.shape)
        c[a] = ix.add(c[a], start)
        kb.store("out", ix.ravel(c, op_t.shape), Load("in1", i, upd.dtype))
    return KernelProgram((kb.finish(),), alias=0)


@lowers(ArgTopK)
def lower_argtopk(sig: Sig) -> KernelProgram:
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

