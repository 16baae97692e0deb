"""Fold each Iota eqn into a Computed binder (its value comes from the graph, not a
checkpoint). Identical Iotas share one binder. An F32 range folds only while every
element is an exact float (length <= 2**24); I32 ranges are always exact."""
from __future__ import annotations

from poot.compiler.rewrite import Rewriter
from poot.dtypes import DType
from poot.ir.ops import Iota
from poot.ir.types import Storage, ValueMeta

F32_EXACT = 2 ** 24


def run(graph, ctx):
    from poot.capability import Use

    rw = Rewriter(graph)
    folded: dict[Iota, object] = {}
    for e in graph.eqns():
        if not isinstance(e.op, Iota):
            continue
        op, meta = e.op, graph.meta(e.out)
        length = op.shape[op.axis]
        if op.dtype is DType.F32 and length > F32_EXACT:
            ctx.record.kept("Iota", e.out, f"F32 range of {length} is not exact past 2**24")
            continue
        if Use.STORAGE not in ctx.table.uses(op.dtype):
            ctx.record.kept("Iota", e.out, f"the target cannot store {op.dtype}")
            continue
        if op in folded:
            rw.substitute(e.out, folded[op])
            ctx.record.rewrote("Iota", e.out, f"same range as {folded[op]!r}")
        else:
            folded[op] = rw.new_input(ValueMeta(meta.aval, Storage.COMPUTED, meta.identity), op)
            rw.substitute(e.out, folded[op])
            ctx.record.rewrote("Iota", e.out, f"folded into Computed {folded[op]!r}")
        rw.remove(e)
    return rw.commit()
