"""Reduce(Sum | Max) over one axis."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from poot.ir.ops.base import ARITH, OpKind, SubOp
from poot.ir.types import TensorType


class ReduceOp(SubOp):
    Sum = "sum"
    Max = "max"


@dataclass(frozen=True, repr=False)
class Reduce(OpKind):
    """Sum or Max over `axis`; `keepdim` keeps it as size 1. Floats accumulate in F32."""

    op: ReduceOp
    axis: int
    keepdim: bool = False
    arity: ClassVar[int] = 1

    def infer(self, ins: Sequence[TensorType]) -> TensorType:
        self.check_arity(ins)
        (x,) = ins
        self.need_dtype(x, ARITH)
        a = self.norm_axis(self.axis, x.rank, ins)
        if self.op is ReduceOp.Max and x.shape[a] == 0:
            self.fail(f"Max over axis {a} of size 0 has no value", ins)
        shape = list(x.shape)
        if self.keepdim:
            shape[a] = 1
        else:
            del shape[a]
        return TensorType(tuple(shape), x.dtype)
