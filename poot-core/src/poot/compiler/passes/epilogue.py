"""Epilogue fusion: a contraction and the pointwise chain that alone consumes it (bias
add, residual add, activation, the SwiGLU gate multiply) become one
ContractionEpilogue(head, n_head, body).

The body's first parameter is the head's result in the head's dtype, so a BF16 head
rounds to BF16 before the first step reads it, and each step rounds through its own
dtype: the spec's rounding rule holds by construction, and the oracle checks it.
"""
from __future__ import annotations

from poot.compiler.region import body_graph, external_inputs, grow
from poot.compiler.rewrite import Rewriter
from poot.compiler.view import GraphView
from poot.ir.ops import (
    Binary,
    Cast,
    ContractionEpilogue,
    DenseContraction,
    GroupedDenseContraction,
    IndexedPackedContraction,
    MatMul,
    PackedContraction,
    Select,
    Unary,
)

HEADS = (DenseContraction, PackedContraction, GroupedDenseContraction, IndexedPackedContraction,
         MatMul)
POINTWISE = (Unary, Binary, Select, Cast)


def pointwise_of_shape(view: GraphView, shape):
    """Epilogue steps: pointwise eqns whose result has the head's shape."""
    return lambda u: isinstance(u.op, POINTWISE) and view.type_of(u.out).shape == shape


def run(graph, ctx):
    view, rw = GraphView(graph), Rewriter(graph)
    for head in view.eqns:
        if not isinstance(head.op, HEADS):
            continue
        body = grow(view, head.out, pointwise_of_shape(view, view.type_of(head.out).shape),
                    lambda v: v in rw.removed or v in rw.replaced)
        if not body:
            ctx.record.kept("ContractionEpilogue", head.out,
                            "no pointwise chain consumes the contraction alone")
            continue
        extras = external_inputs(body, [head.out])[1:]
        op = ContractionEpilogue(head.op, len(head.inputs),
                                 body_graph(view, body, [head.out] + extras, "epilogue"))
        args = list(head.inputs) + extras
        # the table's ContractionEpilogue entry covers the body; the head is asked apart
        refused = ctx.refusal(head.op, head.inputs, head, view) or \
            ctx.refusal(op, args, body[-1], view)
        if refused:
            ctx.record.kept("ContractionEpilogue", head.out, f"target refuses: {refused}")
            continue
        rw.replace(body[-1], op, args, [head] + body)
        steps = ", ".join(repr(e.op) for e in body)
        ctx.record.rewrote("ContractionEpilogue", body[-1].out, f"{head.op.name} + [{steps}]")
    return rw.commit()
