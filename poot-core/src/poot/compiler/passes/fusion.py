"""Pointwise fusion into Fused regions and reduction-rooted row fusion into FusedRow.

A region grows backward from a root (taking roots last to first, so a root is an
eqn no later region took) over the producers that only it reads: pointwise eqns
and last-axis keepdim reductions whose results are full rows [..., D] or row
scalars [..., 1] of one shape; RMSNorm and softmax each become one FusedRow.
Concat, movement, data and compute ops are boundaries. Single eqns stay as they are.
"""
from __future__ import annotations

from poot.compiler.region import body_graph, external_inputs, grow_back
from poot.compiler.rewrite import Rewriter
from poot.compiler.view import GraphView
from poot.ir.ops import Binary, Cast, Fused, FusedRow, Reduce, Select, Unary

POINTWISE = (Unary, Binary, Select, Cast)


def row_shape(view: GraphView, root) -> tuple[int, ...] | None:
    """The full row shape a region rooted here works on, or None if it cannot root one."""
    if isinstance(root.op, POINTWISE):
        return view.type_of(root.out).shape
    if isinstance(root.op, Reduce) and reduces_rows(view, root):
        return view.type_of(root.inputs[0].id).shape
    return None


def reduces_rows(view: GraphView, e) -> bool:
    rank = view.type_of(e.inputs[0].id).rank
    return e.op.keepdim and rank >= 1 and e.op.axis % rank == rank - 1


def admits(view: GraphView, full: tuple[int, ...]):
    row = full[:-1] + (1,) if full else full

    def admit(e) -> bool:
        out = view.type_of(e.out).shape
        if isinstance(e.op, POINTWISE):
            return out in (full, row)
        return isinstance(e.op, Reduce) and reduces_rows(view, e) and \
            view.type_of(e.inputs[0].id).shape == full

    return admit


def run(graph, ctx):
    view, rw = GraphView(graph), Rewriter(graph)
    taken = lambda v: v in rw.removed or v in rw.replaced
    tried: set = set()
    for root in reversed(view.eqns):
        if taken(root.out) or root.out in tried:
            continue
        full = row_shape(view, root)
        if full is None:
            continue
        members = grow_back(view, root, admits(view, full), taken)
        if len(members) < 2:
            continue
        params = external_inputs(members)
        body = body_graph(view, members, params, "region")
        rowwise = any(isinstance(e.op, Reduce) for e in members)
        op = FusedRow(body, -1) if rowwise else Fused(body)
        refused = ctx.refusal(op, params, root, view)
        if refused:  # its members root no smaller regions: each eqn is grown over once
            ctx.record.kept(op.name, root.out, f"target refuses: {refused}")
            tried.update(e.out for e in members)
            continue
        rw.replace(root, op, params, members)
        ctx.record.rewrote(op.name, root.out, f"{len(members)} eqns: "
                           + ", ".join(repr(e.op) for e in members))
    return rw.commit()
