"""prologue: a pointwise region (a Fused) of a decode step whose only reader is a
contraction taking it as its activation (bare, or as an epilogue's head) goes into it:
ContractionPrologue(head, n_head, body). The contraction computes the region per element
as it reads its activation (a decode step's SwiGLU of the stacked gate|up halves, read
by the down projection): no kernel or buffer between them. Only targets that declare the
op get it."""
from __future__ import annotations

from poot.compiler.passes.contraction_match import activation_readers
from poot.compiler.rewrite import Rewriter
from poot.compiler.view import GraphView, NoMatch
from poot.ir.graph import Value
from poot.ir.ops import (
    ContractionEpilogue,
    ContractionPrologue,
    DenseContraction,
    Fused,
    PackedContraction,
)

NAME = "ContractionPrologue"
#: activation rows up to which the region goes into the contraction (a decode step's; a
#: prefill chunk's GEMM stages its activation tiles from memory)
ROWS = 4
HEADS = (DenseContraction, PackedContraction)


def run(graph, ctx):
    view, rw = GraphView(graph), Rewriter(graph)
    for e in view.eqns:
        if type(e.op) is not Fused:
            continue
        try:
            r = _reader(view, e)
        except NoMatch as why:
            ctx.record.kept(NAME, e.out, str(why))
            continue
        op, args, inner = _with_prologue(r, e)
        refused = ctx.refusal(inner, args[:inner.n_head + len(e.inputs) - 1], r, view) or \
            ctx.refusal(op, args, r, view)
        if refused:
            ctx.record.kept(NAME, e.out, f"target refuses: {refused}")
            continue
        rw.replace(r, op, args)
        rw.remove(e)
        ctx.record.rewrote(NAME, e.out, f"{len(e.op.body.eqns())} pointwise eqns into "
                                        f"{inner.head.name}")
    return rw.commit()


def _reader(view: GraphView, e):
    """The one contraction reading the region as its activation; NoMatch otherwise."""
    t = view.type_of(e.out)
    if any(not isinstance(x, Value) or view.type_of(x.id) != t for x in e.inputs):
        raise NoMatch("an operand is not of the region's result type")
    readers = activation_readers(view, e, HEADS, 1, ROWS, "a region")
    if not readers:
        raise NoMatch("no reader")
    return readers[0]


def _with_prologue(r, e):
    """(op, operands, the ContractionPrologue) of reader `r` with region `e` inside."""
    first, more = e.inputs[0], list(e.inputs[1:])
    if isinstance(r.op, ContractionEpilogue):
        n = r.op.n_head
        inner = ContractionPrologue(r.op.head, n, e.op.body)
        args = [first, *r.inputs[1:n], *more]
        return ContractionEpilogue(inner, len(args), r.op.body), args + list(r.inputs[n:]), \
            inner
    inner = ContractionPrologue(r.op, len(r.inputs), e.op.body)
    return inner, [first, *r.inputs[1:], *more], inner
