"""Match a subgraph against a composite's own primitive definition.

A pass guesses a composite and its operands from a few eqns near a candidate root
(cheap walks that fail fast), then `match_definition` proves the guess: the
composite's `define` chain, instantiated at the operands' types, must be the
subgraph rooted at the candidate eqn for eqn, op for op, literal for literal.
So a rewrite is exactly the chain the composite stands for, never a lookalike.
"""
from __future__ import annotations

from poot.compiler.view import GraphView, NoMatch
from poot.errors import PootError
from poot.ir.graph import Eqn, Lit, Value
from poot.ir.ops import Iota, OpKind
from poot.ir.types import StorageClass, ValueId


def match_definition(view: GraphView, op: OpKind, args: list[ValueId], root: Eqn,
                     exclusive: bool = True) -> list[Eqn]:
    """The graph eqns that `op(args)` replaces (root last), or NoMatch with the reason.

    Every matched eqn but the root must be read only by matched eqns (and be no
    output), so the rewrite removes them all and computes nothing twice; with
    `exclusive=False` others may read them too (the rewrite keeps them, and dce drops
    what no reader is left for).
    """
    from poot.oracle import definition

    types = [view.type_of(a) for a in args]
    try:
        if op.infer(types) != view.type_of(root.out):
            raise NoMatch(f"{op.name} would not give {view.type_of(root.out)} here")
        d = definition(op, types)
    except PootError as exc:
        raise NoMatch(f"{op.name} does not type-check on these operands: {exc}") from None
    env: dict[ValueId, ValueId] = dict(zip(d.inputs(), args, strict=True))
    matched: dict[ValueId, Eqn] = {}

    def same(dv: ValueId, gv: ValueId) -> bool:
        if dv in env:
            return env[dv] == gv
        de = d.producer(dv)
        if isinstance(de.op, Iota) and view.storage(gv) is StorageClass.COMPUTED:
            ok = view.graph.computed_def(gv) == de.op      # a folded Iota
        else:
            ge = view.producer(gv)
            ok = ge is not None and ge.op == de.op and len(ge.inputs) == len(de.inputs) and all(
                dx == gx if isinstance(dx, Lit) else isinstance(gx, Value) and same(dx.id, gx.id)
                for dx, gx in zip(de.inputs, ge.inputs, strict=True))
            if ok:
                matched[gv] = ge
        if ok:
            env[dv] = gv
        return ok

    if not same(d.result(), root.out):
        raise NoMatch(f"the chain at {root.out!r} is not {op.name}'s definition")
    inside = set(matched)
    for v, e in matched.items() if exclusive else ():
        if v != root.out and (view.is_output(v) or
                              any(u.out not in inside for u in view.users.get(v, ()))):
            raise NoMatch(f"{v!r} ({e.op.name}) inside the chain is also read outside it")
    return sorted(matched.values(), key=lambda e: view.position[e.out])
