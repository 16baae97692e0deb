"""The parts of a graph: values, literals, eqns, outputs, and the tables that hold them.

They sit below `poot.ir.graph` so that the whole-graph check (`poot.ir.check`) and the
text form (`poot.ir.text`) read them without importing the Graph that calls them.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field

from poot.dtypes import DType
from poot.errors import DtypeError
from poot.ir.ops.base import OpKind
from poot.ir.types import (
    BoundaryId,
    Slot,
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


__all__ = ["Value", "Lit", "Operand", "Eqn", "OutputKind", "GraphOutput"]
