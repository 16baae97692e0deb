"""Packed contractions: a packed weight is decoded while it is consumed, never whole.

    MatMul(x, Transpose(PackedDequant(w, srcs)))       -> PackedContraction(w)(x, *srcs)
    Gather(PackedDequant(w, srcs), ids)                -> PackedRowGather(w)(ids, *srcs)
    IndexedMatMul(x, Transpose(Reshape([E, N, K], PackedDequant(w, srcs))), idx)
                                                       -> IndexedPackedContraction(w, E)
"""
from __future__ import annotations

from poot.compiler.passes.contraction_match import Contraction, on_matmul, run_matchers, weight_path
from poot.compiler.view import GraphView, NoMatch
from poot.ir.ops import (
    Gather,
    IndexedMatMul,
    IndexedPackedContraction,
    MatMul,
    PackedContraction,
    PackedDequant,
    PackedRowGather,
    Reshape,
    Transpose,
)


def packed_path(view: GraphView, v):
    path = weight_path(view, v)
    if path.dequant is None:
        raise NoMatch("the weight is not a PackedDequant")
    if path.casts:
        raise NoMatch("a Cast sits between the decode and the contraction")
    return path, path.dequant.op.weight, [view.value(path.dequant, i)
                                          for i in range(len(path.dequant.inputs))]


def match_matmul(view: GraphView, mm) -> Contraction:
    path, weight, sources = packed_path(view, view.value(mm, 1))
    if path.moves != [Transpose((1, 0))]:
        raise NoMatch(f"the decoded weight reaches the MatMul through "
                      f"{[m.name for m in path.moves]}, not as W^T")
    return on_matmul(view, mm, PackedContraction(weight), sources, [path.dequant] + path.steps)


def match_gather(view: GraphView, g) -> Contraction | None:
    d = view.producer(g.inputs[0].id)
    if d is None or not isinstance(d.op, PackedDequant):
        return None
    if g.op.axis != 0:
        raise NoMatch("rows of a packed table are gathered on axis 0 only")
    return Contraction(PackedRowGather(d.op.weight), [view.value(g, 1), *map(
        lambda i: view.value(d, i), range(len(d.inputs)))], g, g, [d], [])


def match_indexed(view: GraphView, im) -> Contraction:
    path, weight, sources = packed_path(view, view.value(im, 1))
    n_all, k = weight.shape
    moves = path.moves
    if len(moves) != 2 or not isinstance(moves[0], Reshape) or moves[1] != Transpose((0, 2, 1)) \
            or len(moves[0].shape) != 3 or moves[0].shape[1:] != (n_all // moves[0].shape[0], k):
        raise NoMatch("the expert stack is not PackedDequant -> Reshape [E, N, K] -> Transpose")
    op = IndexedPackedContraction(weight, moves[0].shape[0])
    return Contraction(op, [view.value(im, 0), view.value(im, 2), *sources], im, im,
                       [path.dequant] + path.steps, [])


MATCHERS = {MatMul: ("PackedContraction", match_matmul),
            Gather: ("PackedRowGather", match_gather),
            IndexedMatMul: ("IndexedPackedContraction", match_indexed)}


def run(graph, ctx):
    return run_matchers(graph, ctx, MATCHERS)
