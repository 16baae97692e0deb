"""Composites through their definitions, for backends with no kernel of their own for them.

A host-kernel backend (the reference backend) runs a compiled graph's composites (Fused,
FusedRow, Attention, Rope, the dense and packed contractions, ...) as the primitive chain
each stands for: exactly what the oracle evaluates. Inlining them before planning lets the
planner treat that chain like any other: the PackedDequant of a packed contraction's const
sources folds at bind time into the weight cache (decoded once, "f32-decoded"), the weight
transpose becomes a strided view, and the intermediates share the arena.
"""
from __future__ import annotations

from poot.ir.graph import Eqn, Graph, GraphOutput, Lit, Operand, Value
from poot.ir.ops import COLLECTIVES
from poot.ir.types import ValueId
from poot.oracle import definition


def has_composites(graph: Graph) -> bool:
    return any(e.op.composite for e in graph.eqns())


def inline_composites(graph: Graph) -> Graph:
    """The same graph with every composite eqn replaced by its primitive definition."""
    draft = graph.edit()
    sub: dict[ValueId, Operand] = {}
    eqns: list[Eqn] = []
    for e in graph.eqns():
        ins = tuple(_subst(x, sub) for x in e.inputs)
        if not e.op.composite or isinstance(e.op, COLLECTIVES):  # collectives: the runtime's
            eqns.append(Eqn(e.op, ins, e.out))
            continue
        sub[e.out] = _inline(draft, e, ins, eqns)
    draft.eqns[:] = eqns
    draft.outputs[:] = [_output(o, sub) for o in graph.outputs()]
    return draft.commit()


def _subst(x: Operand, sub: dict[ValueId, Operand]) -> Operand:
    return sub.get(x.id, x) if isinstance(x, Value) else x


def _inline(draft, e: Eqn, ins: tuple[Operand, ...], eqns: list[Eqn]) -> Operand:
    types = [x.type if isinstance(x, Lit) else draft.type_of(x.id) for x in ins]
    body = definition(e.op, types)
    env: dict[ValueId, Operand] = dict(zip(body.inputs(), ins, strict=True))
    for be in body.eqns():
        operands = [x if isinstance(x, Lit) else env[x.id] for x in be.inputs]
        if be.op.composite:           # a definition may use other composites
            env[be.out] = _inline(draft, Eqn(be.op, tuple(operands), be.out), tuple(operands),
                                  eqns)
            continue
        new = draft.new_eqn(be.op, operands)
        eqns.append(new)
        env[be.out] = Value(new.out)
    return env[body.result()]


def _output(o: GraphOutput, sub: dict[ValueId, Operand]) -> GraphOutput:
    got = sub.get(o.value)
    if got is None:
        return o
    if not isinstance(got, Value):
        raise ValueError(f"output {o!r} is a literal after inlining")  # pragma: no cover
    return GraphOutput(got.id, o.kind, o.label, o.boundary, o.input)
