"""Common-subexpression elimination: an eqn that repeats an earlier one (same op, same
operands) is dropped and its readers read the earlier value. Every op of the IR is a
pure function of its operands (state writes return new values), so this is exact.

A decoder step repeats itself across layers: the RoPE rows gathered by position, the
query positions, the mask pieces; after this pass each is computed once.
"""
from __future__ import annotations

from poot.compiler.rewrite import Rewriter
from poot.ir.graph import Lit


def operand_key(x, sub):
    if isinstance(x, Lit):  # repr tells -0.0 from 0.0, which compare equal
        return ("lit", x.dtype, repr(x.value))
    return sub.get(x.id, x.id)


def run(graph, ctx):
    rw = Rewriter(graph)
    seen: dict[tuple, object] = {}
    for e in graph.eqns():
        try:
            key = (e.op, tuple(operand_key(x, rw.subst) for x in e.inputs))
            hash(key)
        except TypeError:  # an op parameter that cannot be hashed: never merged
            continue
        first = seen.setdefault(key, e.out)
        if first != e.out:
            rw.substitute(e.out, first)
            rw.remove(e)
            ctx.record.rewrote(e.op.name, e.out, f"same as {first!r}")
    return rw.commit()
