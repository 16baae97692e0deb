"""The selection pass: a sparse-attention indexer written as primitive chains (the
definitions of BlockTopK and SelectedAttention) becomes those two composites.

The chains have no device lowering of their own, so a target that cannot plan the
composites refuses here, with its typed error, before anything runs.
"""
from __future__ import annotations

from poot.compiler.match import match_definition
from poot.compiler.passes import attention
from poot.compiler.rewrite import Rewriter
from poot.compiler.view import GraphView, NoMatch
from poot.ir.ops import (
    ArgTopK,
    Binary,
    BlockTopK,
    Broadcast,
    MatMul,
    Reduce,
    Reshape,
    Select,
    SelectedAttention,
    Transpose,
)


def guess_topk(view: GraphView, root) -> tuple[BlockTopK, list]:
    scores = view.defined_by(root.inputs[0], MatMul, "block scores")
    pooled = view.defined_by(view.defined_by(scores.inputs[1], Transpose, "pooled keys^T")
                             .inputs[0], Reduce, "pooled keys")
    blocks = view.defined_by(pooled.inputs[0], Reshape, "key blocks")
    if len(blocks.op.shape) != 4:
        raise NoMatch("the keys are not split into [H, S/block, block, D]")
    return BlockTopK(blocks.op.shape[2], root.op.k), [view.value(scores, 0),
                                                     view.value(blocks, 0)]


def selected(view: GraphView, scale, q, k, v, mask4) -> tuple[SelectedAttention, list]:
    """SelectedAttention's operands read off the selection mask the chain adds."""
    sel = view.defined_by(view.defined_by(mask4, Reshape, "the selection mask").inputs[0],
                          Select, "the selection mask")
    mask = view.value(view.defined_by(sel.inputs[1], Broadcast, "the broadcast mask"), 0)
    keep = view.defined_by(sel.inputs[0], Reduce, "the kept keys")
    eq = view.defined_by(keep.inputs[0], Binary, "block == selected")
    ge = view.defined_by(eq.inputs[0], Binary, "block >= selected")
    blocks = view.value(view.defined_by(ge.inputs[0], Reshape, "the selected blocks"), 0)
    blk = view.defined_by(ge.inputs[1], Binary, "key block ids")
    return SelectedAttention(view.literal(blk, 1).value, scale), [q, k, v, blocks, mask]


def match_topk(view: GraphView, root):
    op, args = guess_topk(view, root)
    return op, args, root, match_definition(view, op, args, root)


def match_selected(view: GraphView, pv):
    return attention.find(view, pv, selected)


def run(graph, ctx):
    view, rw = GraphView(graph), Rewriter(graph)
    found = [(e, match_topk, "BlockTopK") for e in view.eqns if isinstance(e.op, ArgTopK)]
    found += [(e, match_selected, "SelectedAttention") for e in attention.candidates(view)]
    for e, match, name in found:
        try:
            op, args, root, chain = match(view, e)
        except NoMatch as why:
            ctx.record.kept(name, e.out, str(why))
            continue
        err = ctx.table.refusal(op, [view.type_of(a) for a in args], view.type_of(root.out))
        if err is not None:
            ctx.record.kept(name, root.out, f"target refuses, and the chain has no lowering: "
                            f"{err}")
            raise err
        rw.replace(root, op, args, chain)
        ctx.record.rewrote(name, root.out, f"{len(chain)} eqns -> {op!r}")
    return rw.commit()
