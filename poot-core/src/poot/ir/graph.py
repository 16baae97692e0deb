"""Graph and GraphEdit (checked rewrites). The parts of a graph (Value, Lit, Eqn,
GraphOutput, OutputKind) live in poot.ir.nodes and are re-exported here, where most
code imports them from.

A Graph is always well formed: Builder.finish and GraphEdit.commit run the
whole-graph check (poot.ir.check). Its tables are private; read them through
the accessors. A pass changes a graph only by `graph.edit()` ... `commit()`.
"""
from __future__ import annotations

from collections.abc import Iterable, Iterator

from poot.errors import EditRefused, GraphError
from poot.ir.check import check_graph
from poot.ir.nodes import Eqn, GraphOutput, Lit, Operand, OutputKind, Value, _Tables
from poot.ir.ops.base import OpKind
from poot.ir.text import format_graph
from poot.ir.types import (
    Identity,
    Slot,
    StorageClass,
    TensorType,
    ValueId,
    ValueMeta,
    require_value_id,
)


class Graph:
    """A flat, typed, topologically ordered SSA list of eqns. Immutable once built."""

    __slots__ = ("_t", "_producer", "_name")

    def __init__(self, tables: _Tables, name: str = "graph"):
        check_graph(tables)
        self._t = tables
        self._name = name
        self._producer: dict[ValueId, int] = {e.out: i for i, e in enumerate(tables.eqns)}

    # -- accessors ---------------------------------------------------------------
    @property
    def name(self) -> str:
        return self._name

    def meta(self, vid: ValueId) -> ValueMeta:
        return self._t.values[require_value_id(vid)]

    def type_of(self, vid: ValueId) -> TensorType:
        return self.meta(vid).aval

    def values(self) -> Iterator[tuple[ValueId, ValueMeta]]:
        """Every value in use: binders, then eqn results, in order."""
        for vid in self._t.inputs:
            yield vid, self._t.values[vid]
        for e in self._t.eqns:
            yield e.out, self._t.values[e.out]

    def inputs(self) -> tuple[ValueId, ...]:
        return tuple(self._t.inputs)

    def consts(self) -> tuple[ValueId, ...]:
        return self._by_storage(StorageClass.CONST)

    def computed(self) -> tuple[ValueId, ...]:
        return self._by_storage(StorageClass.COMPUTED)

    def computed_def(self, vid: ValueId) -> OpKind:
        """The generator (e.g. a folded Iota) that defines a Computed value."""
        return self._t.computed[require_value_id(vid)]

    def params(self) -> tuple[ValueId, ...]:
        """Region parameters (inputs of Device storage: bodies of fused regions)."""
        return self._by_storage(StorageClass.DEVICE)

    def slots(self) -> tuple[tuple[ValueId, Slot], ...]:
        return tuple(self._t.slots)

    def state(self) -> tuple[tuple[ValueId, ValueId], ...]:
        """(state_in binder, state_out value) pairs."""
        return tuple((o.input, o.value) for o in self._t.outputs
                     if o.kind is OutputKind.STATE_NEXT)

    def eqns(self) -> tuple[Eqn, ...]:
        return tuple(self._t.eqns)

    def outputs(self) -> tuple[GraphOutput, ...]:
        return tuple(self._t.outputs)

    def result(self) -> ValueId:
        return next(o.value for o in self._t.outputs if o.kind is OutputKind.RESULT)

    def producer(self, vid: ValueId) -> Eqn | None:
        i = self._producer.get(require_value_id(vid))
        return None if i is None else self._t.eqns[i]

    def users(self) -> dict[ValueId, list[Eqn]]:
        """Map each value to the eqns that read it (computed on demand)."""
        out: dict[ValueId, list[Eqn]] = {}
        for e in self._t.eqns:
            for v in e.value_inputs():
                out.setdefault(v, []).append(e)
        return out

    def _by_storage(self, cls: StorageClass) -> tuple[ValueId, ...]:
        return tuple(v for v in self._t.inputs if self._t.values[v].storage.cls is cls)

    # -- editing -----------------------------------------------------------------
    def edit(self) -> GraphEdit:
        return GraphEdit(self)

    def __str__(self) -> str:
        return format_graph(self)

    def __repr__(self) -> str:
        return f"<Graph {self._name}: {len(self._t.inputs)} inputs, {len(self._t.eqns)} eqns>"


class GraphEdit:
    """A draft of a graph. Change it, then `commit()` to get a new checked Graph.

    The draft's lists are plain Python lists; `new_value`, `new_input` and
    `replace_uses` keep the value table consistent. A commit that loses a
    witness, export or state pair, or changes the result's type, is refused
    (EditRefused); a refused commit leaves the original graph unchanged.
    """

    def __init__(self, graph: Graph):
        self._base = graph
        t = graph._t.copy()
        self._t = t
        self.eqns: list[Eqn] = t.eqns
        self.outputs: list[GraphOutput] = t.outputs
        self.inputs: list[ValueId] = t.inputs
        self.slots: list[tuple[ValueId, Slot]] = t.slots

    def meta(self, vid: ValueId) -> ValueMeta:
        return self._t.values[vid]

    def type_of(self, vid: ValueId) -> TensorType:
        return self._t.values[vid].aval

    def new_value(self, aval: TensorType, identity: Identity = Identity.ANONYMOUS) -> ValueId:
        """A fresh Device value for an eqn the pass will add."""
        return self._t.values.append(ValueMeta(aval, identity=identity))

    def new_eqn(self, op: OpKind, inputs: Iterable[Operand]) -> Eqn:
        """An eqn with a fresh output whose type comes from `op.infer`."""
        inputs = tuple(inputs)
        types = [x.type if isinstance(x, Lit) else self.type_of(x.id) for x in inputs]
        return Eqn(op, inputs, self.new_value(op.infer(types)))

    def new_input(self, meta: ValueMeta, generator: OpKind | None = None) -> ValueId:
        """A fresh binder (Const, Slot, State or Computed with its generator)."""
        vid = self._t.values.append(meta)
        self._t.inputs.append(vid)
        if meta.storage.cls is StorageClass.SLOT:
            self._t.slots.append((vid, meta.storage.slot))
        if meta.storage.cls is StorageClass.COMPUTED:
            self._t.computed[vid] = generator
        return vid

    def replace_uses(self, old: ValueId, new: ValueId) -> None:
        """Make every eqn and output that reads `old` read `new` instead."""
        require_value_id(old)
        require_value_id(new)
        sub = {old: new}
        self.eqns[:] = [_substitute(e, sub) for e in self.eqns]
        self.outputs[:] = [
            GraphOutput(new, o.kind, o.label, o.boundary, o.input) if o.value == old else o
            for o in self.outputs]

    def toposort(self) -> None:
        """Reorder eqns so every operand is defined before use (stable)."""
        defined = set(self._t.inputs)
        pending = list(self.eqns)
        ordered: list[Eqn] = []
        while pending:
            rest = []
            for e in pending:
                if all(v in defined for v in e.value_inputs()):
                    ordered.append(e)
                    defined.add(e.out)
                else:
                    rest.append(e)
            if len(rest) == len(pending):
                raise GraphError(f"eqns form a cycle or read undefined values: {rest[:3]}")
            pending = rest
        self.eqns[:] = ordered

    def commit(self) -> Graph:
        before = self._base
        want = sorted((o.key() for o in before.outputs()), key=repr)
        got = sorted((o.key() for o in self.outputs), key=repr)
        if want != got:
            from collections import Counter

            def say(k):
                kind, label, boundary, inp = k
                return " ".join([kind.value] + [repr(x) for x in (label, inp) if x is not None]
                                + ([f"@{boundary.name}"] if boundary else []))

            w, g = Counter(map(say, want)), Counter(map(say, got))
            raise EditRefused(f"rewrite changes the graph's outputs; lost: "
                              f"{sorted((w - g).elements())}, added: "
                              f"{sorted((g - w).elements())}")
        res = [o for o in self.outputs if o.kind is OutputKind.RESULT]
        if res and self.type_of(res[0].value) != before.type_of(before.result()):
            raise EditRefused(f"rewrite changes the result type from "
                              f"{before.type_of(before.result())} to {self.type_of(res[0].value)}")
        # drop binders nothing reads any more only if they are Computed (consts, slots
        # and state are the graph's interface and stay)
        return Graph(self._t.copy(), before.name)


def _substitute(e: Eqn, sub: dict[ValueId, ValueId]) -> Eqn:
    if not any(isinstance(x, Value) and x.id in sub for x in e.inputs):
        return e
    return Eqn(e.op, [Value(sub[x.id]) if isinstance(x, Value) and x.id in sub else x
                      for x in e.inputs], e.out)


__all__ = ["Graph", "GraphEdit", "Value", "Lit", "Operand", "Eqn", "OutputKind", "GraphOutput"]
