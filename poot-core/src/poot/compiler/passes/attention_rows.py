"""attention_rows (after attention): a step of several tokens transposes its query rows
[..., T, Hq, D] to Attention's [..., Hq, T, D] and the result back; the Transpose of an
Attention of a Transpose, each swapping the head and token axes and read by nothing
else, becomes one TokenMajorAttention over the rows where they are (no Transpose kernel
on either side). A step of one token has none: its Transposes move only unit axes.
"""
from __future__ import annotations

from poot.compiler.passes.relabel import moves_only_unit_axes
from poot.compiler.rewrite import rewrite_each
from poot.compiler.view import GraphView, NoMatch
from poot.ir.ops import Attention, TokenMajorAttention, Transpose


def run(graph, ctx):
    return rewrite_each(graph, ctx, "TokenMajorAttention", Transpose, _rows,
                        lambda op, chain: "Transpose + Attention + Transpose")


def swaps_rows(view: GraphView, e) -> bool:
    """Whether Transpose `e` swaps its operand's head and token axes (the last but two and
    the last but one) and so reorders it."""
    shape = view.type_of(view.value(e, 0)).shape
    r = len(shape)
    return r >= 3 and e.op.perm == tuple(range(r - 3)) + (r - 2, r - 3, r - 1) and \
        not moves_only_unit_axes(e.op.perm, shape)


def _rows(view: GraphView, out):
    if not swaps_rows(view, out):
        raise NoMatch("the Transpose does not swap the head and token axes of many rows")
    att = view.defined_by(out.inputs[0], Attention, "the transposed result")
    if type(att.op) is not Attention or view.single_user(att.out) is not out:
        raise NoMatch(f"{att.op.name} at {att.out!r} is read elsewhere too")
    q = view.defined_by(att.inputs[0], Transpose, "the attention's q")
    if not swaps_rows(view, q) or view.single_user(q.out) is not att:
        raise NoMatch(f"q at {q.out!r} is no swap of rows read by the attention alone")
    return TokenMajorAttention(att.op.scale), [q.inputs[0], *att.inputs[1:]], [q, att]
