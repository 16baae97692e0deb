"""Q8PackedContraction on CUDA: the shared lowering (poot.codegen.lower.q8), whose integer
GEMV multiplies QuantizeI8's codes with the weight's integers by dp4a (target.DOT2). The
CUDA table declares it as its own for every format with integer codes, and `program_for`
lowers it.
"""
from __future__ import annotations

from poot.codegen.lower.q8 import q8_formats, q8_program

__all__ = ["q8_formats", "q8_program"]
