"""The whole-graph check run by Builder.finish and GraphEdit.commit."""
from __future__ import annotations

from poot.errors import GraphError, IRError
from poot.ir.nodes import Lit, OutputKind, _Tables
from poot.ir.types import StorageClass


def check_graph(t: _Tables) -> None:
    """Raise GraphError (or the op's typed error) unless the tables form a valid graph:
    binders well classed, SSA, topological order, every operand defined, every
    type equal to its op's infer, one result, state pairs of identical type."""
    defined = set()
    for vid in t.inputs:
        if vid not in t.values:
            raise GraphError(f"input {vid!r} is not in the value table")
        if vid in defined:
            raise GraphError(f"input {vid!r} is bound twice")
        meta = t.values[vid]
        if meta.storage.cls is StorageClass.COMPUTED and t.computed.get(vid) is None:
            raise GraphError(f"computed value {vid!r} has no generator")
        defined.add(vid)
    want_slots = [(v, t.values[v].storage.slot) for v in t.inputs
                  if t.values[v].storage.cls is StorageClass.SLOT]
    if list(t.slots) != want_slots:
        raise GraphError("the slots table does not match the Slot binders")

    for i, e in enumerate(t.eqns):
        if e.out in defined:
            raise GraphError(f"eqn {i} ({e.op.name}) redefines {e.out!r}: not SSA")
        types = []
        for x in e.inputs:
            if isinstance(x, Lit):
                types.append(x.type)
                continue
            if x.id not in defined:
                raise GraphError(f"eqn {i} ({e.op.name}) reads {x.id!r} before it is defined "
                                 "(not in topological order, or from another graph)")
            types.append(t.values[x.id].aval)
        if e.out not in t.values:
            raise GraphError(f"eqn {i} ({e.op.name}) writes {e.out!r}, not in the value table")
        meta = t.values[e.out]
        if meta.storage.cls is not StorageClass.DEVICE:
            raise GraphError(f"eqn {i} result {e.out!r} must have Device storage, "
                             f"not {meta.storage}")
        got = e.op.infer(types)
        if got != meta.aval:
            raise GraphError(f"eqn {i} ({e.op!r}) infers {got} but {e.out!r} is {meta.aval}")
        defined.add(e.out)

    results = [o for o in t.outputs if o.kind is OutputKind.RESULT]
    if len(results) != 1:
        raise GraphError(f"a graph has exactly one result output, found {len(results)}")
    seen_state, seen_bound = set(), set()
    for o in t.outputs:
        if o.value not in defined:
            raise GraphError(f"output {o!r} names an undefined value")
        if o.kind is OutputKind.STATE_NEXT:
            if o.input not in t.values or o.input not in defined or \
                    t.values[o.input].storage.cls is not StorageClass.STATE:
                raise GraphError(f"{o!r}: {o.input!r} is not a State binder")
            if t.values[o.input].aval != t.values[o.value].aval:
                raise GraphError(f"{o!r}: state_out {t.values[o.value].aval} differs from "
                                 f"state_in {t.values[o.input].aval}")
            if o.input in seen_state:
                raise GraphError(f"State binder {o.input!r} has two next values")
            seen_state.add(o.input)
        if o.kind is OutputKind.EXPORT:
            if o.boundary is None or o.boundary in seen_bound:
                raise GraphError(f"{o!r}: export boundary missing or repeated")
            seen_bound.add(o.boundary)
    states = {v for v in t.inputs if t.values[v].storage.cls is StorageClass.STATE}
    if states != seen_state:
        missing = sorted(states - seen_state, key=lambda v: v.index)
        raise GraphError(f"State binders without a state_next output: {missing}")


__all__ = ["check_graph", "IRError"]
