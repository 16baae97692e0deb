"""Elementwise primitives: Unary, Binary, Select, Cast, and the Iota generator."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from poot.dtypes import DType
from poot.errors import DtypeError
from poot.ir.ops.base import ARITH, FLOATS, INTS, OpKind, SubOp, broadcast_shapes
from poot.ir.types import TensorType


class UnaryOp(SubOp):
    Neg = "neg"
    Exp = "exp"
    Log = "log"
    Sqrt = "sqrt"
    Recip = "recip"
    Tanh = "tanh"
    Erf = "erf"
    Not = "not"    # bitwise, I32/U32
    Clz = "clz"    # count leading zeros of the 32-bit word; clz(0) = 32

    @property
    def bitwise(self) -> bool:
        return self in (UnaryOp.Not, UnaryOp.Clz)


class BinaryOp(SubOp):
    Add = "add"
    Sub = "sub"
    Mul = "mul"
    Div = "div"    # integers: truncates toward zero; x / 0 = 0
    Max = "max"    # floats: a NaN operand gives NaN (the first one's when both are)
    Min = "min"    # floats: a NaN operand gives NaN (the first one's when both are)
    Ge = "ge"      # indicator: I32 1 where a >= b, else 0
    GeU = "geu"    # unsigned comparison of 32-bit words, I32 indicator
    And = "and"
    Or = "or"
    Xor = "xor"
    Shl = "shl"    # shift by >= 32 (as unsigned) gives 0
    Shr = "shr"    # I32: arithmetic; U32: logical; by >= 32: sign fill / 0

    @property
    def bitwise(self) -> bool:
        return self in (BinaryOp.GeU, BinaryOp.And, BinaryOp.Or, BinaryOp.Xor, BinaryOp.Shl,
                        BinaryOp.Shr)

    @property
    def compare(self) -> bool:
        return self in (BinaryOp.Ge, BinaryOp.GeU)


@dataclass(frozen=True, repr=False)
class Unary(OpKind):
    op: UnaryOp
    arity: ClassVar[int] = 1

    def infer(self, ins: Sequence[TensorType]) -> TensorType:
        self.check_arity(ins)
        (x,) = ins
        if self.op.bitwise:
            self.need_dtype(x, INTS)
        elif self.op is UnaryOp.Neg:
            self.need_dtype(x, FLOATS + (DType.I32,))
        else:
            self.need_dtype(x, FLOATS)
        return x

    def params(self):
        return {"op": self.op}


@dataclass(frozen=True, repr=False)
class Binary(OpKind):
    op: BinaryOp
    arity: ClassVar[int] = 2

    def infer(self, ins: Sequence[TensorType]) -> TensorType:
        self.check_arity(ins)
        a, b = ins
        if a.dtype != b.dtype:
            self.fail(f"operand dtypes differ ({a.dtype} vs {b.dtype}); insert a Cast", ins,
                      DtypeError)
        self.need_dtype(a, INTS if self.op.bitwise else ARITH)
        shape = broadcast_shapes(self, a, b)
        return TensorType(shape, DType.I32 if self.op.compare else a.dtype)


@dataclass(frozen=True, repr=False)
class Select(OpKind):
    """cond (I32, nonzero picks if_true), if_true, if_false; numpy broadcasting.

    Moves the chosen element bit for bit: a NaN or Inf in the unselected branch
    never reaches the output.
    """

    arity: ClassVar[int] = 3

    def infer(self, ins: Sequence[TensorType]) -> TensorType:
        self.check_arity(ins)
        c, t, f = ins
        self.need_dtype(c, (DType.I32,), "condition")
        if t.dtype != f.dtype:
            self.fail(f"branches have different dtypes ({t.dtype} vs {f.dtype})", ins,
                      DtypeError)
        return TensorType(broadcast_shapes(self, c, t, f), t.dtype)


@dataclass(frozen=True, repr=False)
class Cast(OpKind):
    """Storage dtype change. Float to narrower float rounds to nearest even;
    float to integer truncates toward zero (saturating); integers wrap."""

    to: DType
    arity: ClassVar[int] = 1

    def __post_init__(self):
        object.__setattr__(self, "to", DType.parse(self.to))

    def infer(self, ins: Sequence[TensorType]) -> TensorType:
        self.check_arity(ins)
        return ins[0].with_dtype(self.to)


@dataclass(frozen=True, repr=False)
class Iota(OpKind):
    """A tensor of `shape` whose elements count 0, 1, ... along `axis`."""

    shape: tuple[int, ...]
    axis: int
    dtype: DType
    arity: ClassVar[int] = 0

    def __post_init__(self):
        object.__setattr__(self, "shape", tuple(int(d) for d in self.shape))
        object.__setattr__(self, "dtype", DType.parse(self.dtype))

    def infer(self, ins: Sequence[TensorType]) -> TensorType:
        self.check_arity(ins)
        self.norm_axis(self.axis, len(self.shape))
        if self.dtype not in (DType.F32, DType.I32):
            self.fail(f"Iota makes F32 or I32 ranges, not {self.dtype}", cls=DtypeError)
        return TensorType(self.shape, self.dtype)
