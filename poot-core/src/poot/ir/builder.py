"""Builder: records eqns into a new Graph, checking each as it goes and the whole at finish."""
from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

from poot.dtypes import DType
from poot.errors import GraphError, TraceError
from poot.ir.graph import Eqn, Graph, GraphOutput, Lit, OutputKind, Value, _Tables
from poot.ir.ops.base import OpKind
from poot.ir.types import (
    BoundaryId,
    Identity,
    Slot,
    SlotKey,
    SlotKind,
    Storage,
    StorageClass,
    TensorType,
    ValueId,
    ValueMeta,
    ValueTable,
    WeightRef,
)

_builder_ids = itertools.count(1)


@dataclass(frozen=True, slots=True)
class Ref:
    """A value of one Builder: its id, its type, and the builder it belongs to."""

    owner: int
    id: ValueId
    type: TensorType

    @property
    def shape(self):
        return self.type.shape

    @property
    def dtype(self) -> DType:
        return self.type.dtype

    def __repr__(self):
        return f"{self.id!r}:{self.type}"


class Builder:
    """Builds one Graph. `compiler=True` allows compiler-only composites (passes, tests)."""

    def __init__(self, name: str = "graph", compiler: bool = False):
        self.name = name
        self.compiler = compiler
        self._uid = next(_builder_ids)
        self._t = _Tables(ValueTable(), [], [], [], [])
        self._names: set[str] = set()

    @property
    def _tables(self) -> _Tables:
        if self._t is None:
            raise GraphError(f"builder {self.name!r} has finished its graph; start a new Builder")
        return self._t

    # -- binders -------------------------------------------------------------------
    def _bind(self, aval: TensorType, storage: Storage, identity: Identity,
              generator: OpKind | None = None) -> Ref:
        vid = self._tables.values.append(ValueMeta(aval, storage, identity))
        self._tables.inputs.append(vid)
        if storage.cls is StorageClass.SLOT:
            self._tables.slots.append((vid, storage.slot))
        if generator is not None:
            self._tables.computed[vid] = generator
        return Ref(self._uid, vid, aval)

    def const(self, aval: TensorType, name: str | WeightRef) -> Ref:
        """A weight or constant table, identified by its WeightRef (or a plain name)."""
        ident = Identity.of_weight(name) if isinstance(name, WeightRef) else Identity.named(name)
        return self._bind(aval, Storage.CONST, ident)

    def slot(self, kind: SlotKind, shape: Sequence[int], name: str,
             bound: int | None = None) -> Ref:
        """A per-step input of `kind`, its values in the kind's range (`bound` exclusive).
        The kind must be a declared role (IRError otherwise)."""
        kind.require_declared()
        aval = TensorType(tuple(shape), kind.dtype)
        storage = Storage(StorageClass.SLOT, Slot(kind, bound))
        return self._bind(aval, storage, Identity.of_slot(SlotKey(kind, name)))

    def state(self, aval: TensorType, name: str) -> Ref:
        """A persistent buffer carried across steps; pair it with `state_next`."""
        return self._bind(aval, Storage.STATE, Identity.named(name))

    def param(self, aval: TensorType, name: str | None = None) -> Ref:
        """A region parameter (the inputs of a fused region's body graph)."""
        ident = Identity.named(name) if name else Identity.ANONYMOUS
        return self._bind(aval, Storage.DEVICE, ident)

    def computed(self, generator: OpKind, name: str | None = None) -> Ref:
        """A compiler-defined constant (a folded Iota) defined by `generator`."""
        ident = Identity.named(name) if name else Identity.ANONYMOUS
        return self._bind(generator.infer([]), Storage.COMPUTED, ident, generator)

    def binder_like(self, meta: ValueMeta, generator: OpKind | None = None,
                    aval: TensorType | None = None) -> Ref:
        """A binder of this graph with another graph's binder's storage and identity (and
        type, unless `aval` is given): graph passes that rebuild a graph copy theirs so."""
        return self._bind(aval or meta.aval, meta.storage, meta.identity, generator)

    # -- eqns ----------------------------------------------------------------------
    def lit(self, value, dtype: DType) -> Lit:
        return Lit(value, dtype)

    def eqn(self, op: OpKind, *operands: Ref | Lit) -> Ref:
        """Record out = op(operands), type-checked now by op.infer."""
        if not isinstance(op, OpKind):
            raise TypeError(f"op must be an OpKind, not {type(op).__name__}")
        if op.compiler_only and not self.compiler:
            raise TraceError(f"{op.name} is a compiler-only composite: the tracer cannot emit "
                             f"it (compile introduces it from its primitive chain)")
        ins, types = [], []
        for x in operands:
            if isinstance(x, Lit):
                ins.append(x)
                types.append(x.type)
            elif isinstance(x, Ref):
                if x.owner != self._uid:
                    raise GraphError(f"operand {x!r} belongs to another graph; values cannot "
                                     f"cross graphs (pass it as an input instead)")
                ins.append(Value(x.id))
                types.append(x.type)
            elif isinstance(x, ValueId):
                raise TypeError("pass a Ref from this builder, not a bare ValueId")
            else:
                raise TypeError(f"operand must be a Ref or Lit, not {type(x).__name__} ({x!r})")
        aval = op.infer(types)
        vid = self._tables.values.append(ValueMeta(aval))
        self._tables.eqns.append(Eqn(op, tuple(ins), vid))
        return Ref(self._uid, vid, aval)

    def inline(self, body: Graph, args: Sequence[Ref]) -> Ref:
        """Emit a body graph's eqns with its parameters bound to `args`; return its result."""
        env = dict(zip(body.inputs(), args))
        if len(env) != len(args) or len(body.inputs()) != len(args):
            raise GraphError(f"body takes {len(body.inputs())} operands, got {len(args)}")
        for e in body.eqns():
            ops = [x if isinstance(x, Lit) else env[x.id] for x in e.inputs]
            env[e.out] = self.eqn(e.op, *ops)
        return env[body.result()]

    def name_value(self, ref: Ref, name: str) -> Ref:
        """Give an eqn result a Named identity (for printing and witnesses)."""
        vid = self._own(ref)
        meta = self._tables.values[vid]
        self._tables.values[vid] = meta.replace(identity=Identity.named(name))
        return ref

    # -- outputs -------------------------------------------------------------------
    def _own(self, ref: Ref) -> ValueId:
        if not isinstance(ref, Ref) or ref.owner != self._uid:
            raise GraphError(f"output {ref!r} is not a value of this graph")
        return ref.id

    def result(self, ref: Ref) -> None:
        self._tables.outputs.append(GraphOutput(self._own(ref), OutputKind.RESULT))

    def witness(self, ref: Ref, label: str) -> None:
        self._tables.outputs.append(GraphOutput(self._own(ref), OutputKind.WITNESS, label=label))

    def export(self, ref: Ref, boundary: str) -> None:
        self._tables.outputs.append(GraphOutput(self._own(ref), OutputKind.EXPORT,
                                                boundary=BoundaryId(boundary)))

    def state_next(self, state_in: Ref, value: Ref) -> None:
        self._tables.outputs.append(GraphOutput(self._own(value), OutputKind.STATE_NEXT,
                                                input=self._own(state_in)))

    def finish(self) -> Graph:
        """Check the whole graph and return it. The builder cannot be used afterwards.

        Outputs are listed result first, then witnesses, exports and state updates."""
        order = list(OutputKind)
        self._tables.outputs.sort(key=lambda o: order.index(o.kind))
        g = Graph(self._tables, self.name)
        self._t = None  # type: ignore[assignment]
        return g


def region(params: Sequence[TensorType], fn, name: str = "region") -> Graph:
    """Build a body graph: `fn(builder, *param_refs) -> result Ref`."""
    b = Builder(name, compiler=True)
    refs = [b.param(t) for t in params]
    b.result(fn(b, *refs))
    return b.finish()
