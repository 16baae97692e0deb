"""Epilogue fusion: a contraction and the pointwise chain that alone consumes it (bias
add, residual add, activation, the SwiGLU gate multiply) become one
ContractionEpilogue(head, n_head, body).

gated (`gated_run`, after pointwise fusion): a Fused region that alone reads both halves
of a contraction's last axis (a stacked gate and up projection's, as Slices read by
nothing else) becomes one GatedContraction(head, n_head, body).

The body's first parameter is the head's result in the head's dtype, so a BF16 head
rounds to BF16 before the first step reads it, and each step rounds through its own
dtype: the spec's rounding rule holds by construction, and the oracle checks it.
"""
from __future__ import annotations

from poot.compiler.region import body_graph, external_inputs, grow
from poot.compiler.rewrite import Rewriter, rewrite_each
from poot.compiler.view import GraphView, NoMatch
from poot.ir.builder import region
from poot.ir.graph import Value
from poot.ir.ops import (
    Binary,
    Cast,
    ContractionEpilogue,
    DenseContraction,
    Fused,
    GatedContraction,
    GroupedDenseContraction,
    IndexedPackedContraction,
    MatMul,
    NormedDenseContraction,
    NormedPackedContraction,
    PackedContraction,
    Q8PackedContraction,
    Select,
    Slice,
    Unary,
)

HEADS = (DenseContraction, PackedContraction, GroupedDenseContraction, IndexedPackedContraction,
         Q8PackedContraction, MatMul)
#: a gate's head may read its rows normed too (norm_contraction ran before it)
GATED_HEADS = HEADS + (NormedDenseContraction, NormedPackedContraction)
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


def gated_run(graph, ctx):
    return rewrite_each(graph, ctx, "GatedContraction", Fused, _gated,
                        lambda op, chain: f"{op.head.name} + Fused halves")


def _gated(view: GraphView, fused):
    """(GatedContraction, its operands, the eqns it replaces) for a Fused region whose
    operands include the two halves of one contraction's last axis, each read only here."""
    if type(fused.op) is not Fused:
        raise NoMatch("a row region (FusedRow) is no gate")
    halves = {}
    for i, x in enumerate(fused.inputs):
        if not isinstance(x, Value) or view.producer(x.id) is None:
            continue
        cut = view.producer(x.id)
        if not isinstance(cut.op, Slice) or view.single_user(x.id) is not fused:
            continue
        src = view.type_of(cut.inputs[0].id)
        if cut.op.norm_axis(cut.op.axis, src.rank) != src.rank - 1:
            continue
        half = src.shape[-1] // 2
        if (cut.op.start, cut.op.end) in ((0, half), (half, 2 * half)):
            halves[int(cut.op.start != 0)] = (i, cut)     # 0: the first half
    if len(halves) != 2 or halves[0][1].inputs[0] != halves[1][1].inputs[0]:
        raise NoMatch("no two halves of one result's last axis among the operands")
    y = halves[0][1].inputs[0].id
    head = view.defined_by(y, GATED_HEADS, "the halves' source")
    if view.uses(y) != 2 or view.is_output(y):
        raise NoMatch(f"{head.op.name} at {y!r} is read elsewhere too")
    (a, cut_a), (b, cut_b) = halves[0], halves[1]
    rest = [i for i in range(len(fused.inputs)) if i not in (a, b)]
    types = [view.type_of(cut_a.out), view.type_of(cut_b.out)] + \
        [view.operand_types(fused)[i] for i in rest]

    def body(bb, lo, hi, *extras):
        refs = dict(zip([a, b, *rest], [lo, hi, *extras], strict=True))
        return bb.inline(fused.op.body, [refs[i] for i in range(len(fused.inputs))])
    op = GatedContraction(head.op, len(head.inputs), region(types, body, "gate"))
    return op, list(head.inputs) + [fused.inputs[i] for i in rest], [head, cut_a, cut_b]
