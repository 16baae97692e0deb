"""Refuse collectives: a collective is a cut between stages, never an eqn of a stage graph."""
from __future__ import annotations

from poot.errors import UnsupportedOp
from poot.ir.ops import AllGather, AllReduce


def run(graph, ctx):
    for e in graph.eqns():
        if isinstance(e.op, (AllReduce, AllGather)):
            ctx.record.kept(e.op.name, e.out, "a collective is a cut between stages")
            raise UnsupportedOp(
                f"{e.op!r} at {e.out!r} inside the stage graph {graph.name!r}: a collective "
                f"is a cut between stages; split the graph there and compile each stage",
                op=e.op.name, backend=ctx.table.backend, device=ctx.table.device)
    return graph
