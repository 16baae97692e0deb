"""Dead-code elimination: drop eqns no output needs, and Computed binders nothing reads.

Consts, slots and state are the graph's interface and stay even when unread.
"""
from __future__ import annotations

from poot.compiler.rewrite import Rewriter
from poot.ir.types import StorageClass


def run(graph, ctx):
    live = {o.value for o in graph.outputs()}
    rw = Rewriter(graph)
    for e in reversed(graph.eqns()):
        if e.out in live:
            live.update(e.value_inputs())
        else:
            rw.remove(e)
            ctx.record.rewrote(e.op.name, e.out, "dead: no output reads it")
    inputs = rw.draft.inputs
    keep = [v for v in inputs
            if v in live or graph.meta(v).storage.cls is not StorageClass.COMPUTED]
    for v in inputs:
        if v not in live and graph.meta(v).storage.cls is StorageClass.COMPUTED:
            ctx.record.rewrote("Computed", v, "dead: no eqn reads it")
    inputs[:] = keep
    return rw.commit()
