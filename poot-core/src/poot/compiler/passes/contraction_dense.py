"""Dense contractions: a checkpoint weight in [N, K] order is contracted where it lies,
with no transpose and no widened copy.

    MatMul(x, Transpose(Cast(W)))            W bf16/f16 [N, K]    -> DenseContraction(x, W)
    MatMul(x, Transpose(W))                  W f32 [N, K]         -> DenseContraction(x, W)
    MatMul(x, Transpose(PackedDequant(w)))   dense:f16words       -> DenseContraction(x, words)
    MatMul(x, Cast(Transpose(Reshape(W))))   W bf16 [G*N, K]      -> GroupedDenseContraction
    Cast(F32, Gather(T, ids))                T bf16 [V, K]        -> DenseRowGather(T, ids)

A Cast commutes with movement, so it may sit anywhere along the weight's path.
"""
from __future__ import annotations

from poot.compiler.passes.contraction_match import (
    Contraction,
    checkpoint_rows,
    on_matmul,
    run_matchers,
    weight_path,
)
from poot.compiler.view import GraphView, NoMatch
from poot.dtypes import DType
from poot.ir.ops import (
    Cast,
    DenseContraction,
    DenseRowGather,
    Gather,
    GroupedDenseContraction,
    MatMul,
    Reshape,
    Transpose,
)
from poot.ir.types import StorageClass

F32, BF16, F16 = DType.F32, DType.BF16, DType.F16
NK = Transpose((1, 0))
WORDS = "dense:f16words"


def match_matmul(view: GraphView, mm) -> Contraction:
    if view.type_of(view.value(mm, 0)).dtype is not F32:
        raise NoMatch("the activation is not F32")
    path = weight_path(view, view.value(mm, 1))
    w = view.type_of(path.source)
    if path.dequant is not None:
        fmt = path.dequant.op.weight.format
        if fmt != WORDS or path.casts or path.moves != [NK]:
            raise NoMatch(f"a packed {fmt} weight: left to the packed contraction pass")
        return on_matmul(view, mm, DenseContraction(), [view.value(path.dequant, 0)],
                         [path.dequant] + path.steps)
    if not checkpoint_rows(view, path.source):
        raise NoMatch(f"the weight {path.source!r} is not a checkpoint weight (Const) or "
                      f"rows of one")
    want_casts = 0 if w.dtype is F32 else 1
    if w.dtype not in (F32, BF16, F16) or len(path.casts) != want_casts or any(
            c.op.to is not F32 for c in path.casts):
        raise NoMatch(f"the weight is {w.dtype} with casts to "
                      f"{[str(c.op.to) for c in path.casts]}; expected bf16/f16 widened to "
                      f"f32 once, or f32")
    if path.moves == [NK]:
        return on_matmul(view, mm, DenseContraction(), [path.source], path.steps)
    a = view.type_of(view.value(mm, 0))
    if len(path.moves) == 2 and isinstance(path.moves[0], Reshape) and \
            path.moves[1] == Transpose((0, 2, 1)) and w.dtype is BF16 and a.rank == 3:
        op = GroupedDenseContraction(path.moves[0].shape[0])
        return Contraction(op, [view.value(mm, 0), path.source], mm, mm, path.steps, [])
    raise NoMatch(f"the weight reaches the MatMul through {[m.name for m in path.moves]}, "
                  f"not as W^T of an [N, K] weight")


def match_row_gather(view: GraphView, cast) -> Contraction | None:
    g = view.producer(cast.inputs[0].id)
    if g is None or not isinstance(g.op, Gather):
        return None
    table = view.value(g, 0)
    if cast.op.to is not F32 or g.op.axis != 0 or view.type_of(table).dtype is not BF16 or \
            view.storage(table) is not StorageClass.CONST:
        raise NoMatch("not rows of a bf16 checkpoint table widened to f32")
    return Contraction(DenseRowGather(), [table, view.value(g, 1)], cast, cast, [g], [])


MATCHERS = {MatMul: ("DenseContraction", match_matmul),
            Cast: ("DenseRowGather", match_row_gather)}


def run(graph, ctx):
    return run_matchers(graph, ctx, MATCHERS)
