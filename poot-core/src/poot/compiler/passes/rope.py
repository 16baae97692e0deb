"""rope_fusion: the rotate-half chain (what poot.ops.rope_partial records) becomes one
Rope{rot} with operands [x, cos, sin]:

    Concat([Sub(Mul(x1, cos), Mul(x2, sin)), Add(Mul(x1, sin), Mul(x2, cos)) (, x[rot:])])
    with x1 = Slice(x, 0..rot/2), x2 = Slice(x, rot/2..rot)
"""
from __future__ import annotations

from poot.compiler.match import match_definition
from poot.compiler.rewrite import Rewriter
from poot.compiler.view import GraphView, NoMatch
from poot.ir.ops import Binary, BinaryOp, Concat, Rope, Slice


def guess(view: GraphView, root) -> tuple[Rope, list]:
    """Rope's parameter and operands read off the first half of the candidate chain."""
    if len(root.inputs) not in (2, 3):
        raise NoMatch("a rotate-half Concat has two or three parts")
    lo = view.defined_by(root.inputs[0], Binary, "the first part")
    if lo.op.op is not BinaryOp.Sub:
        raise NoMatch("the first part is not x1*cos - x2*sin")
    m1 = view.defined_by(lo.inputs[0], Binary, "x1*cos")
    m2 = view.defined_by(lo.inputs[1], Binary, "x2*sin")
    x1 = view.defined_by(m1.inputs[0], Slice, "x1")
    rot = 2 * (x1.op.end - x1.op.start)
    return Rope(rot), [view.value(x1, 0), view.value(m1, 1), view.value(m2, 1)]


def run(graph, ctx):
    view, rw = GraphView(graph), Rewriter(graph)
    for e in view.eqns:
        if not isinstance(e.op, Concat):
            continue
        try:
            op, args = guess(view, e)
            chain = match_definition(view, op, args, e)
        except NoMatch as why:
            ctx.record.kept("Rope", e.out, str(why))
            continue
        refused = ctx.refusal(op, args, e, view)
        if refused:
            ctx.record.kept("Rope", e.out, f"target refuses: {refused}")
            continue
        rw.replace(e, op, args, chain)
        ctx.record.rewrote("Rope", e.out, f"{len(chain)} eqns -> Rope(rot={op.rot})")
    return rw.commit()
