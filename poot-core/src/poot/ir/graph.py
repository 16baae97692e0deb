"""Graph, Eqn, operands and outputs; GraphEdit for checked rewrites.

A Graph is always well formed: Builder.finish and GraphEdit.commit run the
whole-graph check (poot.ir.check). Its tables are private; read them through
the accessors. A pass changes a graph only by `graph.edit()` ... `commit()`.
"""
from __future__ import annotations

import enum
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from poot.dtypes import DType
from poot.errors import DtypeError, EditRefused, GraphError
from poot.ir.ops.base import OpKind
from poot.ir.types import (
    BoundaryId,
    Identity,
    Slot,
    StorageClass,
    TensorType,
    ValueId,
    ValueMeta,
    ValueTable,
    require_value_id,
)


# -- operands ------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Value:
    """An operand that names a value of the graph."""

    id: ValueId

    def __post_init__(self):
        require_value_id(self.id, "Value operand")

    def __repr__(self):
        return repr(self.id)


@dataclass(frozen=True, slots=True)
class Lit:
    """A scalar literal operand with an explicit dtype."""

    value: float | int
    dtype: DType

    def __post_init__(self):
        object.__setattr__(self, "dtype", DType.parse(self.dtype))
        v = self.value
        if self.dtype.is_int:
            import numpy as np

            if not isinstance(v, (int, float, np.integer, np.floating)) or isinstance(
                    v, (float, np.floating)) and not float(v).is_integer():
                raise DtypeError(f"literal {v!r} is not an integer; a {self.dtype} literal "
                                 f"holds whole numbers")
            info = np.iinfo(self.dtype.numpy)
            if not info.min <= int(v) <= info.max:
                raise DtypeError(f"literal {v!r} does not fit {self.dtype} "
                                 f"[{info.min}, {info.max}]")
        object.__setattr__(self, "value", int(v) if self.dtype.is_int else float(v))

    @property
    def type(self) -> TensorType:
        return TensorType((), self.dtype)

    def __repr__(self):
        return f"{self.value!r}:{self.dtype}"


Operand = Value | Lit


@dataclass(frozen=True, slots=True)
class Eqn:
    """out = op(inputs). Single output; parameters live inline in `op`."""

    op: OpKind
    inputs: tuple[Operand, ...]
    out: ValueId

    def __post_init__(self):
        object.__setattr__(self, "inputs", tuple(self.inputs))
        for x in self.inputs:
            if not isinstance(x, (Value, Lit)):
                raise TypeError(f"eqn operand must be Value or Lit, not {type(x).__name__}")
        require_value_id(self.out, "eqn output")

    def value_inputs(self) -> list[ValueId]:
        return [x.id for x in self.inputs if isinstance(x, Value)]


# -- outputs --------------------------------------------------------------------------
class OutputKind(enum.Enum):
    RESULT = "result"
    WITNESS = "witness"
    EXPORT = "export"
    STATE_NEXT = "state_next"


@dataclass(frozen=True, slots=True)
class GraphOutput:
    """One entry of the outputs list: Result, Witness(label), Export(BoundaryId),
    StateNext(input) where `input` is the State binder this value replaces."""

    value: ValueId
    kind: OutputKind
    label: str | None = None
    boundary: BoundaryId | None = None
    input: ValueId | None = None

    def __post_init__(self):
        require_value_id(self.value, "output value")
        if self.input is not None:
            require_value_id(self.input, "state_next input")

    def key(self) -> tuple:
        """What a rewrite must preserve: the output's kind and what it names."""
        return (self.kind, self.label, self.boundary, self.input)

    def __repr__(self):
        if self.kind is OutputKind.RESULT:
            return f"result {self.value!r}"
        if self.kind is OutputKind.WITNESS:
            return f"witness {self.value!r} {self.label!r}"
        if self.kind is OutputKind.EXPORT:
            return f"export {self.value!r} @{self.boundary.name}"
        return f"state_next {self.value!r} <- {self.input!r}"


@dataclass
class _Tables:
    values: ValueTable[ValueMeta]
    inputs: list[ValueId]
    slots: list[tuple[ValueId, Slot]]
    eqns: list[Eqn]
    outputs: list[GraphOutput]
    computed: dict[ValueId, OpKind] = field(default_factory=dict)

    def copy(self) -> _Tables:
        return _Tables(self.values.copy(), list(self.inputs), list(self.slots), list(self.eqns),
                       list(self.outputs), dict(self.computed))


class Graph:
    """A flat, typed, topologically ordered SSA list of eqns. Immutable once built."""

    __slots__ = ("_t", "_producer", "_name")

    def __init__(self, tables: _Tables, name: str = "graph"):
        from poot.ir.check import check_graph

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
        from poot.ir.text import format_graph

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
