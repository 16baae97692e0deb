"""Row reductions: Reduce, and FusedRow regions (RMSNorm, softmax) as one kernel.

One workgroup per row: each thread accumulates a strided part of the row in
registers, then one cooperative reduction combines the threads. Floats
accumulate in F32, integers in I32.
"""
from __future__ import annotations

import math

from poot.codegen import index as ix
from poot.codegen.expr import Const, Expr, Load, i32, maximum
from poot.codegen.lower.base import Sig, lowers
from poot.codegen.program import KernelProgram, local_index
from poot.codegen.region import RegionEval
from poot.dtypes import DType
from poot.errors import DtypeLowering, UnsupportedOp
from poot.ir.graph import Value
from poot.ir.ops import FusedRow, Reduce, ReduceOp

F32, I32 = DType.F32, DType.I32


def accumulator_dtype(op: ReduceOp, dtype: DType, name: str) -> DType:
    if dtype.is_float:
        return F32
    if dtype is DType.U32 and op is ReduceOp.Max:
        raise DtypeLowering("Max of u32 has no signed accumulator", op=name, dtype=str(dtype))
    return I32


def identity(op: ReduceOp, acc: DType) -> Const:
    if op is ReduceOp.Sum:
        return Const(0.0 if acc is F32 else 0, acc)
    return Const(float("-inf"), F32) if acc is F32 else Const(-(2 ** 31), I32)


def combine(op: ReduceOp, acc: Expr, v: Expr) -> Expr:
    return acc + v if op is ReduceOp.Sum else maximum(acc, v)


def row_reduce(kb, op: ReduceOp, length: int, workgroup: int, element, acc: DType,
               name: str = "acc", enter=None, leave=None) -> Expr:
    """Every thread folds elements j = local_index, + workgroup, ... of a row of `length`
    (`element(j)` gives one, already of dtype `acc`), then the workgroup combines."""
    part = kb.var(name, identity(op, acc))
    with kb.for_("j", local_index(), length, workgroup) as j:
        if enter:
            enter()
        kb.assign(part, combine(op, part, element(j)))
        if leave:
            leave()
    return kb.reduce(name + "_all", op, part)


#: rows up to which a row reduction takes workgroups of up to 1024 threads where the target
#: launches them: a decode step's norms are one row, so one workgroup does all the work
#: and its latency is the kernel's (an 8B model's RMSNorm over 4096: 4.7 us with 256)
WIDE_ROWS = 8


def row_workgroups(sig: Sig, rows: int, length: int):
    """A kernel with one workgroup per row (a power of two of threads, 32 to 256, near the
    row length; up to 1024 for few rows where the target has WIDE_WORKGROUPS), its
    buffers declared; returns (builder, workgroup size, row variable)."""
    from poot.codegen.target import WIDE_WORKGROUPS

    wide = WIDE_WORKGROUPS in sig.features and rows <= WIDE_ROWS
    wg = ix.pow2_at_least(length, hi=1024 if wide else 256)
    grid, row = ix.launch_groups(rows)
    kb = sig.builder(grid, (wg,))
    sig.declare_all(kb)
    return kb, wg, kb.let("row", row)


@lowers(Reduce)
def lower_reduce(sig: Sig) -> KernelProgram:
    x = sig.type(0)
    a = sig.op.norm_axis(sig.op.axis, x.rank)
    length = x.shape[a]
    inner = math.prod(x.shape[a + 1:])
    rows = x.size // max(length, 1)
    acc = accumulator_dtype(sig.op.op, x.dtype, "Reduce")
    kb, wg, r = row_workgroups(sig, rows, length)
    with kb.if_(ix.lt(r, i32(rows))):  # whole workgroups in or out: uniform
        base = kb.let("base", ix.add(ix.mul(ix.div(r, inner), length * inner), ix.mod(r, inner)))
        total = row_reduce(kb, sig.op.op, length, wg,
                           lambda j: Load("in0", ix.add(base, ix.mul(j, inner)),
                                          x.dtype).cast(acc), acc)
        with kb.if_(ix.eq(local_index(), i32(0))):
            kb.store("out", r, total.cast(sig.out.dtype))
    return KernelProgram((kb.finish(),))


@lowers(FusedRow)
def lower_fused_row(sig: Sig) -> KernelProgram:
    body = sig.op.body
    reduces = [e for e in body.eqns() if isinstance(e.op, Reduce)]
    if not reduces:
        raise UnsupportedOp("FusedRow region has no reduction", op="FusedRow")
    full = body.type_of(reduces[0].inputs[0].id)
    a = reduces[0].op.norm_axis(reduces[0].op.axis, full.rank)
    for e in reduces:
        t = body.type_of(e.inputs[0].id)
        if t.shape != full.shape or e.op.norm_axis(e.op.axis, t.rank) != a or (
                not e.op.keepdim and e.out != body.result()):
            raise UnsupportedOp("FusedRow reductions must share one operand shape and axis "
                                "and keep their axis (unless they are the root)",
                                op="FusedRow")
    length = full.shape[a]
    rows = full.size // max(length, 1)
    row_shape = full.shape[:a] + full.shape[a + 1:]
    out = sig.out
    per_row = out.rank == full.rank - 1 or (out.rank == full.rank and out.shape[a] == 1)
    if not per_row and out.shape != full.shape:
        raise UnsupportedOp(f"FusedRow root {out} is neither the row shape {full} nor one "
                            "value per row", op="FusedRow")
    kb, wg, r = row_workgroups(sig, rows, length)
    with kb.if_(ix.lt(r, i32(rows))):
        rc = [kb.let(f"r{d}", c) if not isinstance(c, Const) else c
              for d, c in enumerate(ix.unravel(r, row_shape))]

        def coords(j):
            return rc[:a] + [j] + rc[a:]

        reduced: dict = {}
        held = not per_row and -(-length // wg) <= ROW_HELD
        params = [lambda pc, i=i: _load(kb, f"in{i}", ix.ravel(pc, sig.type(i).shape),
                                        sig.type(i).dtype, held) for i in range(len(sig.ins))]
        ev = RegionEval(kb, body, params, reduce=lambda e, c: reduced[e.out])
        if held:
            _held_row(kb, body, ev, reduces, reduced, length, wg, full, coords)
        else:
            for e in reduces:
                acc = accumulator_dtype(e.op.op, full.dtype, "FusedRow")
                def element(j, e=e, acc=acc):
                    return ev.at(e.inputs[0].id, coords(j)).cast(acc)
                total = row_reduce(kb, e.op.op, length, wg, element, acc,
                                   enter=ev.push, leave=ev.pop)
                reduced[e.out] = kb.let("reduced", total.cast(body.type_of(e.out).dtype))
            if per_row:
                with kb.if_(ix.eq(local_index(), i32(0))):
                    kb.store("out", r, ev.result_at(coords(i32(0)) if out.rank == full.rank
                                                    else rc))
            else:
                with kb.for_("j", local_index(), length, wg) as j:
                    ev.push()
                    c = coords(j)
                    kb.store("out", ix.ravel(c, full.shape), ev.result_at(c))
                    ev.pop()
    return KernelProgram((kb.finish(),))


#: rows of at most this many elements per thread stay in registers between a FusedRow's
#: reduction and its output (all loads issued before the reduction, none after)
ROW_HELD = 8


def _load(kb, name, index, dtype, bound: bool):
    value = Load(name, index, dtype)
    return kb.let("x", value) if bound else value


def _held_row(kb, body, ev, reduces, reduced, length: int, wg: int, full, coords) -> None:
    """A FusedRow whose output is the row, unrolled: every thread's elements j = lane,
    lane + wg, ... (clamped into the row, masked out of the reductions) and every operand
    at them are loaded first, so the operands read only by the output (a norm's weight)
    arrive with the row instead of after the reductions; the output reuses the loads."""
    li = local_index()
    spots = []
    for r in range(-(-length // wg)):
        at = ix.add(li, r * wg)
        live = None if (r + 1) * wg <= length else ix.lt(at, i32(length))
        j = kb.let("j", at if live is None else ix.minimum(at, i32(length - 1)))
        spots.append((coords(j), live))
    for c, _ in spots:
        for vid in body.inputs():
            ev.operand(Value(vid), c)
    for e in reduces:
        acc = accumulator_dtype(e.op.op, full.dtype, "FusedRow")
        part = None
        for c, live in spots:
            v = ev.at(e.inputs[0].id, c).cast(acc)
            if live is not None:
                v = ix.Sel(live, v, identity(e.op.op, acc))
            part = v if part is None else combine(e.op.op, part, v)
        total = kb.reduce("acc_all", e.op.op, kb.let("acc", part))
        reduced[e.out] = kb.let("reduced", total.cast(body.type_of(e.out).dtype))
    for c, live in spots:
        value = ev.result_at(c)
        index = ix.ravel(c, full.shape)
        if live is None:
            kb.store("out", index, value)
        else:
            with kb.if_(live):
                kb.store("out", index, value)
