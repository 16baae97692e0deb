"""Shape primitives: Broadcast, Reshape, Transpose, Slice, Concat."""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from poot.errors import DtypeError
from poot.ir.ops.base import OpKind
from poot.ir.types import TensorType


def _ints(v) -> tuple[int, ...]:
    return tuple(int(d) for d in v)


@dataclass(frozen=True, repr=False)
class Broadcast(OpKind):
    """Expand to `shape` by numpy rules (prepend dims; stretch size-1 dims)."""

    shape: tuple[int, ...]
    arity: ClassVar[int] = 1
    deciding: ClassVar[str] = "operand"

    def __post_init__(self):
        object.__setattr__(self, "shape", _ints(self.shape))

    def infer(self, ins: Sequence[TensorType]) -> TensorType:
        self.check_arity(ins)
        (x,) = ins
        if x.rank > len(self.shape):
            self.fail(f"cannot broadcast rank {x.rank} to shape {self.shape}", ins)
        for d, t in zip(reversed(x.shape), reversed(self.shape)):
            if d not in (1, t):
                self.fail(f"cannot broadcast {x.shape} to {self.shape}", ins)
        return TensorType(self.shape, x.dtype)


@dataclass(frozen=True, repr=False)
class Reshape(OpKind):
    """Same element count, new shape; lowers to a buffer alias (no dispatch)."""

    shape: tuple[int, ...]
    arity: ClassVar[int] = 1
    deciding: ClassVar[str] = "operand"

    def __post_init__(self):
        object.__setattr__(self, "shape", _ints(self.shape))

    def infer(self, ins: Sequence[TensorType]) -> TensorType:
        self.check_arity(ins)
        (x,) = ins
        if math.prod(self.shape) != x.size:
            self.fail(f"cannot reshape {x.size} elements to {self.shape}", ins)
        return TensorType(self.shape, x.dtype)


@dataclass(frozen=True, repr=False)
class Transpose(OpKind):
    """Reorder axes: out.shape[i] = x.shape[perm[i]]; may lower to a strided view."""

    perm: tuple[int, ...]
    arity: ClassVar[int] = 1
    deciding: ClassVar[str] = "operand"

    def __post_init__(self):
        object.__setattr__(self, "perm", _ints(self.perm))

    def infer(self, ins: Sequence[TensorType]) -> TensorType:
        self.check_arity(ins)
        (x,) = ins
        if sorted(self.perm) != list(range(x.rank)):
            self.fail(f"perm {self.perm} is not a permutation of {x.rank} axes", ins)
        return TensorType(tuple(x.shape[p] for p in self.perm), x.dtype)


@dataclass(frozen=True, repr=False)
class Slice(OpKind):
    """Contiguous subrange [start, end) on one axis."""

    axis: int
    start: int
    end: int
    arity: ClassVar[int] = 1
    deciding: ClassVar[str] = "operand"

    def infer(self, ins: Sequence[TensorType]) -> TensorType:
        self.check_arity(ins)
        (x,) = ins
        a = self.norm_axis(self.axis, x.rank, ins)
        if not 0 <= self.start <= self.end <= x.shape[a]:
            self.fail(f"range [{self.start}, {self.end}) outside axis {a} of size "
                      f"{x.shape[a]}", ins)
        shape = list(x.shape)
        shape[a] = self.end - self.start
        return TensorType(tuple(shape), x.dtype)


@dataclass(frozen=True, repr=False)
class Concat(OpKind):
    """Join operands along `axis`; a fusion boundary."""

    axis: int
    arity: ClassVar[None] = None
    deciding: ClassVar[str] = "operand"

    def infer(self, ins: Sequence[TensorType]) -> TensorType:
        if not ins:
            self.fail("needs at least one operand")
        first = ins[0]
        a = self.norm_axis(self.axis, first.rank, ins)
        total = 0
        for t in ins:
            if t.dtype != first.dtype:
                self.fail("operands have different dtypes", ins, DtypeError)
            if t.rank != first.rank or any(
                    t.shape[i] != first.shape[i] for i in range(t.rank) if i != a):
                self.fail(f"shapes differ off axis {a}", ins)
            total += t.shape[a]
        shape = list(first.shape)
        shape[a] = total
        return TensorType(tuple(shape), first.dtype)
