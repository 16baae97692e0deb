"""Lowerings: one planned eqn (op, operand types or literals, output type) -> kernels.

`lower(op, ins, out)` returns a `KernelProgram`: the eqn's backend-neutral kernels, its
scratch buffers and its in-place alias.
BufferParam conventions: tensor operand i is buffer `in{i}` (BufferParam.operand = i,
its position among the eqn's operands, literals included), the output is
`out` (BufferParam.operand = OUT). A buffer may view an operand's bytes as U32
words (16-bit weights, packed sources); its count is then the number of
whole words, and the planner pads such allocations to 4 bytes.
"""
from __future__ import annotations

from poot.codegen.lower.base import LOWERINGS, Sig, lower, lowers

# the modules register their lowerings on import
from poot.codegen.lower import (  # noqa: E402,F401  isort: skip
    pointwise, data, reduce, matmul, contraction, rope, attention, sparse, scan, quantize,
)

__all__ = ["LOWERINGS", "Sig", "lower", "lowers"]
