"""Compute primitives: MatMul, IndexedMatMul, PackedDequant, and the Scan recurrence."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from poot.dtypes import DType
from poot.errors import DtypeError
from poot.ir.ops.base import FLOATS, OpKind, broadcast_shapes
from poot.ir.types import TensorType

if TYPE_CHECKING:  # pragma: no cover
    from poot.ir.packed import PackedWeight
    from poot.ir.graph import Graph


def matmul_type(op: OpKind, a: TensorType, b: TensorType) -> TensorType:
    """numpy matmul rule for rank >= 2 operands: batch dims broadcast."""
    if a.rank < 2 or b.rank < 2:
        op.fail("operands must have rank >= 2", [a, b])
    if a.shape[-1] != b.shape[-2]:
        op.fail(f"contraction sizes differ ({a.shape[-1]} vs {b.shape[-2]})", [a, b])
    batch = broadcast_shapes(op, TensorType(a.shape[:-2], a.dtype),
                             TensorType(b.shape[:-2], b.dtype))
    return TensorType(batch + (a.shape[-2], b.shape[-1]), a.dtype)


@dataclass(frozen=True, repr=False)
class MatMul(OpKind):
    """a [..., M, K] @ b [..., K, N] -> [..., M, N]; GEMV and GEMM are one op.

    Floats accumulate in F32 and round once to the operand dtype.
    """

    arity: ClassVar[int] = 2
    deciding: ClassVar[str] = "operand"
    needs: ClassVar[str] = "dot"

    def infer(self, ins: Sequence[TensorType]) -> TensorType:
        self.check_arity(ins)
        a, b = ins
        if a.dtype != b.dtype:
            self.fail("operand dtypes differ", ins, DtypeError)
        self.need_dtype(a, FLOATS + (DType.I32,))
        return matmul_type(self, a, b)


@dataclass(frozen=True, repr=False)
class IndexedMatMul(OpKind):
    """x [M, K], W [E, K, N], idx [M] I32 -> [M, N]: row m contracts with W[idx[m]]."""

    arity: ClassVar[int] = 3
    deciding: ClassVar[str] = "operand"
    needs: ClassVar[str] = "dot"

    def infer(self, ins: Sequence[TensorType]) -> TensorType:
        self.check_arity(ins)
        x, w, idx = ins
        self.need_dtype(idx, (DType.I32,), "idx")
        if x.dtype != w.dtype:
            self.fail("x and W dtypes differ", ins, DtypeError)
        if x.rank != 2 or w.rank != 3 or idx.shape != (x.shape[0],) or \
                w.shape[1] != x.shape[1]:
            self.fail("expected x [M, K], W [E, K, N], idx [M]", ins)
        return TensorType((x.shape[0], w.shape[2]), x.dtype)


@dataclass(frozen=True, repr=False)
class PackedDequant(OpKind):
    """Decode a packed weight to F32 [N, K]. Operands: its sources in role order."""

    weight: PackedWeight
    arity: ClassVar[None] = None
    deciding: ClassVar[str] = "format"

    def infer(self, ins: Sequence[TensorType]) -> TensorType:
        check_sources(self, self.weight, ins)
        return TensorType(self.weight.shape, DType.F32)


def check_sources(op: OpKind, weight: PackedWeight, ins: Sequence[TensorType]) -> None:
    specs = weight.sources()
    if len(ins) != len(specs):
        op.fail(f"{weight.format} takes {len(specs)} sources "
                f"({', '.join(s.role for s in specs)}), got {len(ins)}", ins)
    for spec, t in zip(specs, ins):
        if t != spec.type:
            op.fail(f"source {spec.role!r} must be {spec.type}, got {t}", ins)


@dataclass(frozen=True, eq=False, repr=False)
class Scan(OpKind):
    """A recurrence: carry_t = body(carry_{t-1}, xs[0][t], xs[1][t], ...) for t < length.

    Operands: the initial carry, then the sequences (leading axis `length`).
    Output: every carry stacked, [length, *carry.shape]. A source composite:
    tracers emit it; its primitive definition unrolls the body.
    """

    body: Graph
    length: int
    composite: ClassVar[bool] = True

    def params(self):
        return {"length": self.length}

    def infer(self, ins: Sequence[TensorType]) -> TensorType:
        if not ins:
            self.fail("needs an initial carry")
        carry, *xs = ins
        if self.length < 1:
            self.fail(f"length {self.length} must be at least 1", ins)
        bad = [x for x in xs if x.rank < 1 or x.shape[0] != self.length]
        if bad:
            self.fail(f"sequences must have a leading axis of length {self.length}", ins)
        p = [self.body.type_of(v) for v in self.body.inputs()]
        want = [carry] + [TensorType(x.shape[1:], x.dtype) for x in xs]
        if p != want:
            self.fail(f"body takes {p}; operands give {want} (length {self.length})", ins)
        if self.body.type_of(self.body.result()) != carry:
            self.fail("body must return a value of the carry's type", ins)
        return TensorType((self.length,) + carry.shape, carry.dtype)

    def define(self, b, ins):
        from poot.ir.ops.shape import Concat, Reshape, Slice

        carry, *xs = ins
        steps = []
        for t in range(self.length):
            xt = [b.eqn(Reshape(x.type.shape[1:]), b.eqn(Slice(0, t, t + 1), x)) for x in xs]
            carry = b.inline(self.body, [carry, *xt])
            steps.append(b.eqn(Reshape((1,) + carry.type.shape), carry))
        return steps[0] if len(steps) == 1 else b.eqn(Concat(0), *steps)
