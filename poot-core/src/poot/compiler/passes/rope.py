"""rope_fusion: the rotate-half chain (what poot.ops.rope_partial records) becomes one
Rope{rot} with operands [x, cos, sin]:

    Concat([Sub(Mul(x1, cos), Mul(x2, sin)), Add(Mul(x1, sin), Mul(x2, cos)) (, x[rot:])])
    with x1 = Slice(x, 0..rot/2), x2 = Slice(x, rot/2..rot)

rope_scatter (`scatter_run`, after it): a ScatterUpdate of a Rope's rows (a KV write of
rotated keys) becomes one RopeScatter.
"""
from __future__ import annotations

from poot.compiler.match import match_definition
from poot.compiler.rewrite import rewrite_each
from poot.compiler.view import GraphView, NoMatch
from poot.errors import ShapeError
from poot.ir.graph import Value
from poot.ir.ops import Binary, BinaryOp, Concat, Reshape, Rope, RopeScatter, ScatterUpdate, Slice


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
    return rewrite_each(graph, ctx, "Rope", Concat, _rope_chain,
                         lambda op, chain: f"{len(chain)} eqns -> Rope(rot={op.rot})")


def scatter_run(graph, ctx):
    """rope_scatter: a ScatterUpdate whose rows are a Rope's result (through a Reshape that
    flattens its leading axes), read by nothing else, becomes one RopeScatter{rot} with
    operands [base, x, cos, sin, slots]: the rotated keys go straight to the KV pool."""
    return rewrite_each(graph, ctx, "RopeScatter", ScatterUpdate, _rope_rows,
                         lambda op, chain: f"Rope(rot={op.rot}) + ScatterUpdate")


def _rope_chain(view: GraphView, root):
    op, args = guess(view, root)
    return op, args, match_definition(view, op, args, root)


def _rope_rows(view: GraphView, scatter):
    """RopeScatter over [Rope, Reshape?] that produce the scatter's rows and feed nothing
    else."""
    chain = []
    e = view.defined_by(scatter.inputs[1], (Rope, Reshape), "the scattered rows")
    if isinstance(e.op, Reshape):
        chain.append(e)
        e = view.defined_by(e.inputs[0], Rope, "the reshaped rows")
    chain.insert(0, e)
    for link, user in zip(chain, chain[1:] + [scatter], strict=True):
        if view.single_user(link.out) is not user:
            raise NoMatch(f"{link.op.name} at {link.out!r} is read elsewhere too")
    op = RopeScatter(e.op.rot)
    args = [scatter.inputs[0], *e.inputs, scatter.inputs[2]]
    try:
        op.infer([view.type_of(x.id) if isinstance(x, Value) else x.type for x in args])
    except ShapeError as why:
        raise NoMatch(str(why)) from None
    return op, args, chain
