"""A Transpose that moves only unit axes is a Reshape: the elements keep their order in
memory, so the planner can alias the bytes instead of dispatching a copy.

Decode steps are full of these (one token: [1, 1, heads, d] <-> [1, heads, 1, d] around
attention and the KV-cache update). Runs after the chain matchers, which read Transposes
as part of their patterns."""
from __future__ import annotations

from poot.compiler.rewrite import Rewriter
from poot.ir.ops import Reshape, Transpose


def moves_only_unit_axes(perm: tuple[int, ...], shape: tuple[int, ...]) -> bool:
    """Whether the axes longer than 1 keep their relative order under `perm`."""
    kept = [p for p in perm if shape[p] != 1]
    return kept == sorted(kept)


def run(graph, ctx):
    rw = Rewriter(graph)
    for e in graph.eqns():
        if not isinstance(e.op, Transpose):
            continue
        shape = graph.type_of(e.inputs[0].id).shape
        if moves_only_unit_axes(e.op.perm, shape):
            out = graph.type_of(e.out).shape
            rw.replace(e, Reshape(out), e.inputs)
            ctx.record.rewrote("Transpose", e.out, f"perm {e.op.perm} of {shape} moves only "
                               "unit axes: a Reshape")
        else:
            ctx.record.kept("Transpose", e.out, f"perm {e.op.perm} of {shape} reorders data")
    return rw.commit()
