"""stacked_gate (after gated): a step of several rows contracts its gate and up
projections each over its half of one stacked weight (views of the one [2F, K] weight, as
poot.models.llama traces them: its decode step's one contraction has halves that are
strided at more rows), and the epilogue pass gave the second its SwiGLU, which reads the
first's result:

    ContractionEpilogue(head over rows [F, 2F) of W, body)(x, W[F:2F], ..., g)
    with g = head over rows [0, F) of W (x, W[0:F], ...), read by nothing else

becomes one GatedContraction over all of W, whose body is the epilogue's with g as the low
half and the head's result as the high one (or the other way round). A GEMV, and a rows
GEMV up to its batch (poot.codegen.lower.gemv), joins each pair in its workgroup: one
kernel where there were two. Only up to `MAX_ROWS` rows: a wider contraction joins the
halves after it (`dot._pair_apart`), writing and reading both halves where the epilogue
read one.
"""
from __future__ import annotations

import math

from poot.compiler.rewrite import rewrite_each
from poot.compiler.view import GraphView, NoMatch
from poot.ir.builder import region
from poot.ir.graph import Value
from poot.ir.ops import (
    ContractionEpilogue,
    DenseContraction,
    GatedContraction,
    PackedContraction,
    Slice,
)

#: the most rows a stacked gate is formed for: a speculative verification or a short
#: prefill chunk, within the rows GEMV's batch (DotSchedule.batch_rows)
MAX_ROWS = 32
HEADS = (DenseContraction, PackedContraction)


def run(graph, ctx):
    return rewrite_each(graph, ctx, "GatedContraction", ContractionEpilogue, _stacked,
                        lambda op, chain: f"{op.head.name} over both halves of its weight")


def _rows_of(view: GraphView, inputs) -> tuple[tuple[int, int], list]:
    """((start, end), whole operands) of a contraction's operands `inputs` whose weight
    operands are Slices of the leading axis of whole tensors, each [start, end) of it;
    its other operands as they are."""
    ranges, whole = set(), [inputs[0]]
    for x in inputs[1:]:
        cut = view.producer(x.id) if isinstance(x, Value) else None
        if cut is not None and isinstance(cut.op, Slice):
            src = view.type_of(view.value(cut, 0))
            if cut.op.norm_axis(cut.op.axis, src.rank) != 0:
                raise NoMatch(f"the weight operand at {x.id!r} is cut along a later axis")
            ranges.add((cut.op.start, cut.op.end, src.shape[0]))
            whole.append(cut.inputs[0])
        else:
            whole.append(x)
    if len(ranges) != 1:
        raise NoMatch("the weight is not one row range of whole tensors")
    (start, end, total), = ranges
    if total != 2 * (end - start) or start not in (0, end - start):
        raise NoMatch(f"rows [{start}, {end}) are no half of a {total}-row weight")
    return (start, end), whole


def _stacked(view: GraphView, epi):
    op = epi.op
    if type(op.head) not in HEADS:
        raise NoMatch(f"the head {op.head.name} is no dense or packed contraction")
    x = epi.inputs[0]
    rows = math.prod(view.type_of(x.id).shape[:-1]) if isinstance(x, Value) else 0
    if not 1 < rows <= MAX_ROWS:
        raise NoMatch(f"{rows} rows (a stacked gate from 2 to {MAX_ROWS})")
    (start, end), whole = _rows_of(view, epi.inputs[:op.n_head])
    extras = list(epi.inputs[op.n_head:])
    for j, g in enumerate(extras):
        other = view.producer(g.id) if isinstance(g, Value) else None
        if other is None or other.op != op.head or other.inputs[0] != x or \
                view.single_user(g.id) is not epi or extras.count(g) != 1:
            continue
        try:
            (o_start, _), o_whole = _rows_of(view, other.inputs)
        except NoMatch:
            continue
        if o_start == start or o_whole != whole:
            continue
        break
    else:
        raise NoMatch("no other half of the weight's rows among the epilogue's operands")
    half = view.type_of(g.id)
    rest = [i for i in range(len(extras)) if i != j]
    types = [half, half] + [view.operand_types(epi)[op.n_head + i] for i in rest]
    high = start != 0        # the epilogue's own head holds the high half

    def body(bb, lo, hi, *more):
        params = [hi if high else lo] + list(more)
        params.insert(1 + j, lo if high else hi)
        return bb.inline(op.body, params)
    n = 2 * (end - start)
    full = PackedContraction(op.head.weight.with_rows(n)) \
        if isinstance(op.head, PackedContraction) else op.head
    gated = GatedContraction(full, op.n_head, region(types, body, "gate"))
    return gated, whole + [extras[i] for i in rest], [other]

