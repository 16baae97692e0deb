"""Collect a pass's rewrites, then apply them to a draft in one linear sweep and commit.

A rewrite replaces a root eqn by one eqn that writes the same value (the composite
has the root's type, so every reader and every output stays valid) and removes the
matched interior eqns. GraphEdit.commit then checks the whole graph.
"""
from __future__ import annotations

from collections.abc import Iterable

from poot.compiler.view import GraphView, NoMatch
from poot.ir.graph import Eqn, Graph, GraphOutput, Operand, Value
from poot.ir.ops import OpKind
from poot.ir.types import ValueId, ValueMeta


class Rewriter:
    def __init__(self, graph: Graph):
        self.graph = graph
        self.draft = graph.edit()
        self.replaced: dict[ValueId, Eqn] = {}
        self.removed: set[ValueId] = set()
        self.subst: dict[ValueId, ValueId] = {}
        self.added: dict[ValueId, list[Eqn]] = {}

    def claimed(self, vids: Iterable[ValueId]) -> bool:
        """Whether any of these eqn results is already part of another rewrite."""
        return any(v in self.replaced or v in self.removed for v in vids)

    def replace(self, root: Eqn, op: OpKind, inputs: Iterable[Operand | ValueId],
                remove: Iterable[Eqn] = ()) -> Eqn:
        ins = tuple(Value(x) if isinstance(x, ValueId) else x for x in inputs)
        new = Eqn(op, ins, root.out)
        self.replaced[root.out] = new
        for e in remove:
            if e.out != root.out:
                self.removed.add(e.out)
        return new

    def add(self, before: Eqn, op: OpKind, inputs: Iterable[Operand | ValueId]) -> ValueId:
        """A new eqn `op(inputs)` placed just before `before`; returns its fresh result."""
        new = self.draft.new_eqn(op, [Value(x) if isinstance(x, ValueId) else x
                                      for x in inputs])
        self.added.setdefault(before.out, []).append(new)
        return new.out

    def remove(self, e: Eqn) -> None:
        self.removed.add(e.out)

    def new_input(self, meta: ValueMeta, generator: OpKind | None = None) -> ValueId:
        return self.draft.new_input(meta, generator)

    def substitute(self, old: ValueId, new: ValueId) -> None:
        """Readers of `old` read `new` (applied in the final sweep)."""
        self.subst[old] = new

    @property
    def changed(self) -> bool:
        return bool(self.replaced or self.removed or self.subst or self.added or
                    len(self.draft.inputs) != len(self.graph.inputs()))

    def commit(self) -> Graph:
        if not self.changed:
            return self.graph
        d, sub = self.draft, self.subst
        eqns = []
        for e in [x for e in d.eqns for x in (*self.added.get(e.out, ()), e)]:
            if e.out in self.removed:
                continue
            e = self.replaced.get(e.out, e)
            if sub and any(isinstance(x, Value) and x.id in sub for x in e.inputs):
                e = Eqn(e.op, [Value(sub[x.id]) if isinstance(x, Value) and x.id in sub
                               else x for x in e.inputs], e.out)
            eqns.append(e)
        d.eqns[:] = eqns
        if sub:
            d.outputs[:] = [GraphOutput(sub.get(o.value, o.value), o.kind, o.label, o.boundary,
                                        o.input) for o in d.outputs]
        return d.commit()


def rewrite_each(graph: Graph, ctx, name: str, root_type: type, match, note) -> Graph:
    """Each eqn of `root_type` that `match(view, e) -> (op, args, chain)` takes and the
    target lowers becomes `op(args)`; the report keeps the reason for every other."""
    view, rw = GraphView(graph), Rewriter(graph)
    for e in view.eqns:
        if not isinstance(e.op, root_type):
            continue
        try:
            op, args, chain = match(view, e)
        except NoMatch as why:
            ctx.record.kept(name, e.out, str(why))
            continue
        refused = ctx.refusal(op, args, e, view)
        if refused:
            ctx.record.kept(name, e.out, f"target refuses: {refused}")
            continue
        rw.replace(e, op, args, chain)
        ctx.record.rewrote(name, e.out, note(op, chain))
    return rw.commit()
