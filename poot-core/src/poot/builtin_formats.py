"""Formats poot-core needs for its own ops: f16 weights held as u32 words.

DenseContraction contracts an f16 checkpoint weight kept as two-byte words
packed in u32 (no widened copy); its definition decodes through this format.
"""
from __future__ import annotations

import numpy as np

from poot.codegen.expr import half_at, half_bits_to_f32
from poot.dtypes import DType
from poot.formats import SourceSpec
from poot.ir.types import TensorType


class F16Words:
    """Logical [N, K] f16 stored as u32 words [N, K/2] (element k in the low half if even)."""

    name = "dense:f16words"

    def roles(self, shape, attrs):
        n, k = shape
        return [SourceSpec("words", TensorType((n, k // 2), DType.U32))]

    def dequantize(self, sources, shape, **attrs):
        (words,) = sources
        return np.ascontiguousarray(words).view("<f2").reshape(shape).astype(np.float32)

    def decode_expr(self, load, n, k, shape, attrs):
        from poot.codegen.expr import i32

        return half_bits_to_f32(half_at(load, "words", n * i32(shape[1]) + k))

    def quantize(self, w, **attrs):
        return [np.ascontiguousarray(w.astype("<f2")).view("<u4")]


FORMATS = [F16Words()]
