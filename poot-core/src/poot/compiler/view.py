"""A read-only view of one graph for pattern matching: producers, users, positions.

Built once per pass in linear time, so that a pass never rescans the eqn list to
ask who reads a value.
"""
from __future__ import annotations

from poot.ir.graph import Eqn, Graph, Lit, Value
from poot.ir.ops import OpKind
from poot.ir.types import StorageClass, TensorType, ValueId


class NoMatch(Exception):
    """A candidate does not have the shape a pass looks for; `args[0]` says why."""


class GraphView:
    def __init__(self, graph: Graph):
        self.graph = graph
        self.eqns = graph.eqns()
        self.position = {e.out: i for i, e in enumerate(self.eqns)}
        self.users = graph.users()
        self.output_uses: dict[ValueId, int] = {}
        for o in graph.outputs():
            self.output_uses[o.value] = self.output_uses.get(o.value, 0) + 1

    def type_of(self, v: ValueId) -> TensorType:
        return self.graph.type_of(v)

    def operand_types(self, e: Eqn) -> list[TensorType]:
        return [x.type if isinstance(x, Lit) else self.graph.type_of(x.id) for x in e.inputs]

    def producer(self, v: ValueId) -> Eqn | None:
        return self.graph.producer(v)

    def uses(self, v: ValueId) -> int:
        """Operand slots and outputs that read `v`."""
        return len(self.users.get(v, ())) + self.output_uses.get(v, 0)

    def storage(self, v: ValueId) -> StorageClass:
        return self.graph.meta(v).storage.cls

    def is_output(self, v: ValueId) -> bool:
        return v in self.output_uses

    def single_user(self, v: ValueId) -> Eqn | None:
        us = self.users.get(v, ())
        return us[0] if len(us) == 1 and not self.is_output(v) else None

    # -- matching helpers: each raises NoMatch with a reason a person can read --------
    def defined_by(self, v, op_type: type[OpKind] | tuple, what: str = "") -> Eqn:
        if isinstance(v, Lit):
            raise NoMatch(f"{what or 'operand'} is a literal, not a {_names(op_type)}")
        vid = v.id if isinstance(v, Value) else v
        e = self.producer(vid)
        if e is None or not isinstance(e.op, op_type):
            got = "a graph input" if e is None else e.op.name
            raise NoMatch(f"{what or repr(vid)} is {got}, not {_names(op_type)}")
        return e

    @staticmethod
    def value(e: Eqn, i: int) -> ValueId:
        x = e.inputs[i]
        if not isinstance(x, Value):
            raise NoMatch(f"operand {i} of {e.op.name} at {e.out!r} is a literal")
        return x.id

    @staticmethod
    def literal(e: Eqn, i: int) -> Lit:
        x = e.inputs[i]
        if not isinstance(x, Lit):
            raise NoMatch(f"operand {i} of {e.op.name} at {e.out!r} is not a literal")
        return x


def _names(op_type) -> str:
    types = op_type if isinstance(op_type, tuple) else (op_type,)
    return " or ".join(t.__name__ for t in types)
