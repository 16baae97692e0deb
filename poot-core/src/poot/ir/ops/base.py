"""The OpKind protocol: one object per operation, parameters inline.

Each op states its type rule (`infer`) next to its parameters. A composite also
states its meaning as the primitive chain it replaces (`define`), which is what
the oracle evaluates and what translation validation compares against.
"""
from __future__ import annotations

import dataclasses
import enum
from collections.abc import Sequence
from typing import TYPE_CHECKING, ClassVar

from poot.dtypes import DType
from poot.errors import DtypeError, ShapeError
from poot.ir.types import TensorType

if TYPE_CHECKING:  # pragma: no cover
    from poot.ir.builder import Builder, Ref


class SubOp(enum.Enum):
    """A sub-op enum (UnaryOp, BinaryOp, ReduceOp): its traits are properties of its
    members, and the capability keys of a family are built from them."""

    @classmethod
    def keys(cls, where=lambda op: True) -> tuple[str, ...]:
        """The table keys ("Binary.Add", ...) of the members `where` selects."""
        family = cls.__name__.removesuffix("Op")
        return tuple(f"{family}.{op.name}" for op in cls if where(op))


class OpKind:
    """Base of every op. Subclasses are frozen dataclasses (hashable, comparable)."""

    #: introduced by compile; the tracer refuses to emit it
    compiler_only: ClassVar[bool] = False
    #: has a primitive definition (`define`) the oracle evaluates
    composite: ClassVar[bool] = False
    #: number of operands, or None when variadic
    arity: ClassVar[int | None] = None
    #: capability traits (poot.capability reads them): which dtype decides whether a
    #: device lowers the op, "operand" (the first operand's), "branches" (Select's
    #: branches), "weight" (a dense contraction's weight), "kv" (an attention's keys: an f32
    #: query may read f16 or bf16 ones), "format" (a packed weight's format name) or "out"
    #: (the result's); and the use of it the device needs,
    #: "storage", "arith" (elementwise arithmetic, reductions, selects) or "dot"
    #: (contraction operands)
    deciding: ClassVar[str] = "out"
    needs: ClassVar[str] = "storage"

    @property
    def name(self) -> str:
        return type(self).__name__

    def infer(self, ins: Sequence[TensorType]) -> TensorType:
        raise NotImplementedError(f"{self.name} has no type rule")  # pragma: no cover

    def check_arity(self, ins: Sequence[TensorType]) -> None:
        if self.arity is not None and len(ins) != self.arity:
            raise ShapeError(f"{self.name} takes {self.arity} operands, got {len(ins)}")

    def define(self, b: Builder, ins: list[Ref]) -> Ref:
        """Emit the primitive chain this composite stands for (composites only)."""
        raise NotImplementedError(f"{self.name} is a primitive")  # pragma: no cover

    def params(self) -> dict:
        """Parameters for printing, in declaration order."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    def __repr__(self) -> str:
        ps = self.params()
        # the sub-op of Unary/Binary/Reduce reads as the op's own name: Mul, Exp, Reduce{Sum,..}
        sub = ps.pop("op", None)
        head = sub.name if sub is not None and self.name in ("Unary", "Binary") else self.name
        if sub is not None and head == self.name:
            ps = {"op": sub, **ps}
        return head + ("{" + ", ".join(f"{k}={_fmt(v)}" for k, v in ps.items()) + "}"
                       if ps else "")

    # -- helpers for type rules ----------------------------------------------
    def fail(self, msg: str, ins: Sequence[TensorType] = (), cls=ShapeError):
        operands = ", ".join(map(repr, ins))
        raise cls(f"{self.name}: {msg} (operands: {operands})")

    def need_dtype(self, t: TensorType, allowed, what: str = "operand"):
        if t.dtype not in allowed:
            names = ", ".join(str(d) for d in allowed)
            self.fail(f"{what} dtype {t.dtype} not allowed; expected one of {names}", [t],
                      DtypeError)

    def norm_axis(self, axis: int, rank: int, ins=()) -> int:
        a = axis + rank if axis < 0 else axis
        if not 0 <= a < rank:
            self.fail(f"axis {axis} out of range for rank {rank}", ins)
        return a


def _fmt(v) -> str:
    if isinstance(v, tuple):
        return "(" + ",".join(_fmt(x) for x in v) + ("," if len(v) == 1 else "") + ")"
    if isinstance(v, DType):
        return str(v)
    if hasattr(v, "value") and hasattr(v, "name") and not isinstance(v, (int, float, str)):
        return v.name
    if isinstance(v, float):
        return repr(v)
    return str(v)


def broadcast_shapes(op: OpKind, *types: TensorType) -> tuple[int, ...]:
    """Numpy broadcasting of the operands' shapes, or a ShapeError naming the op."""
    rank = max(t.rank for t in types)
    out = []
    for i in range(rank):
        dims = {t.shape[t.rank - rank + i] for t in types if t.rank - rank + i >= 0}
        dims.discard(1)
        if len(dims) > 1:
            op.fail(f"shapes {' and '.join(str(t.shape) for t in types)} do not broadcast",
                    types)
        out.append(dims.pop() if dims else 1)
    return tuple(out)


FLOATS = tuple(d for d in DType if d.is_float)
INTS = (DType.I32, DType.U32)
ARITH = FLOATS + (DType.I32, DType.U32, DType.I16, DType.U16, DType.I8, DType.U8)
