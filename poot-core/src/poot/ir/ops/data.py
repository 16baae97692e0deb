"""Data movement primitives: Gather, ScatterUpdate, DynamicUpdateSlice, ArgTopK."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from poot.dtypes import DType
from poot.errors import DtypeError
from poot.ir.ops.base import OpKind
from poot.ir.types import TensorType

I32 = (DType.I32,)


@dataclass(frozen=True, repr=False)
class Gather(OpKind):
    """out = take(src, idx, axis): src.shape[:axis] + idx.shape + src.shape[axis+1:].

    Embedding lookup, RoPE table row, paged KV read. An index outside
    [0, src.shape[axis]) is a bind-time error (slots declare their range).
    """

    axis: int = 0
    arity: ClassVar[int] = 2
    deciding: ClassVar[str] = "operand"

    def infer(self, ins: Sequence[TensorType]) -> TensorType:
        self.check_arity(ins)
        src, idx = ins
        self.need_dtype(idx, I32, "index")
        a = self.norm_axis(self.axis, src.rank, ins)
        return TensorType(src.shape[:a] + idx.shape + src.shape[a + 1:], src.dtype)


@dataclass(frozen=True, repr=False)
class ScatterUpdate(OpKind):
    """base [P, ...], src [N, ...], slots [N] I32 -> base with row t of src at slots[t].

    A slot of -1 writes nothing. In place on the donated pool; cost follows N.
    Two rows naming the same slot: the later row wins.
    """

    arity: ClassVar[int] = 3
    deciding: ClassVar[str] = "operand"

    def infer(self, ins: Sequence[TensorType]) -> TensorType:
        self.check_arity(ins)
        base, src, slots = ins
        self.need_dtype(slots, I32, "slots")
        if src.dtype != base.dtype:
            self.fail("src and base dtypes differ", ins, DtypeError)
        if base.rank < 1 or src.rank != base.rank or src.shape[1:] != base.shape[1:]:
            self.fail("src rows must match base rows", ins)
        if slots.shape != src.shape[:1]:
            self.fail(f"slots must be [{src.shape[0]}]", ins)
        return base


@dataclass(frozen=True, repr=False)
class DynamicUpdateSlice(OpKind):
    """Write `update` into `operand` at `index` (an I32 scalar or [1]) along `axis`.

    The index is clamped to [0, operand.shape[axis] - update.shape[axis]] (the
    XLA rule), so the write never leaves the buffer.
    """

    axis: int = 0
    arity: ClassVar[int] = 3
    deciding: ClassVar[str] = "operand"

    def infer(self, ins: Sequence[TensorType]) -> TensorType:
        self.check_arity(ins)
        op, upd, index = ins
        self.need_dtype(index, I32, "index")
        if index.size != 1:
            self.fail("index must hold one element", ins)
        if upd.dtype != op.dtype:
            self.fail("update and operand dtypes differ", ins, DtypeError)
        a = self.norm_axis(self.axis, op.rank, ins)
        if upd.rank != op.rank or any(
                (u > o) if i == a else (u != o)
                for i, (u, o) in enumerate(zip(upd.shape, op.shape))):
            self.fail(f"update {upd.shape} does not fit operand {op.shape} on axis {a}", ins)
        return op


@dataclass(frozen=True, repr=False)
class ArgTopK(OpKind):
    """Indices of the k largest entries along the last axis, largest first.

    Stable: among equal values the lower index comes first.
    """

    k: int
    arity: ClassVar[int] = 1
    deciding: ClassVar[str] = "operand"
    needs: ClassVar[str] = "arith"

    def infer(self, ins: Sequence[TensorType]) -> TensorType:
        self.check_arity(ins)
        (x,) = ins
        if x.rank < 1 or not 1 <= self.k <= x.shape[-1]:
            self.fail(f"k={self.k} must be in [1, {x.shape[-1] if x.rank else 0}]", ins)
        return TensorType(x.shape[:-1] + (self.k,), DType.I32)
