"""The input domains of an arbitrary eqn, for cases exported from a real model's graph.

Each operand gets the domain that keeps the oracle's result meaningful: indices in
range for the operands that index, positive values under Log/Sqrt, divisors away
from zero, f16 words for dense u32 weights, packed sources from the format's
quantizer, small values where exponentials overflow.
"""
from __future__ import annotations

from poot.ir import ops as O
from poot.ir.types import TensorType

#: each Unary sub-op's input domain where it needs one (the catalog's cases and those
#: exported from a model's graph; "special", or "any" for an exported eqn, otherwise)
UNARY = {O.UnaryOp.Log: "positive", O.UnaryOp.Sqrt: "positive", O.UnaryOp.Recip: "away",
         O.UnaryOp.Exp: "small", O.UnaryOp.Not: "words", O.UnaryOp.Clz: "words"}
PACKED = (O.PackedDequant, O.PackedContraction, O.PackedRowGather, O.IndexedPackedContraction,
          O.Q8PackedContraction)


def _packed(weight, n_before: int, n: int) -> list:
    return [("packed", weight, i) for i in range(n - n_before)]


def domains(op: O.OpKind, ins: list[TensorType]) -> list:
    """One domain per operand of `op` (see poot.conformance.inputs)."""
    n = len(ins)
    if isinstance(op, O.Unary):
        return [UNARY.get(op.op, "any")]
    if isinstance(op, O.Binary):
        if op.op in (O.BinaryOp.Shl, O.BinaryOp.Shr):
            return ["words", "shift"]
        if op.op.bitwise:
            return ["words", "words"]
        return ["any", "away" if op.op is O.BinaryOp.Div else "any"]
    if isinstance(op, O.Select):
        return [("index", 2), "any", "any"]
    if isinstance(op, O.Cast):
        return ["int" if op.to.is_int and ins[0].dtype.is_float else "small"]
    if isinstance(op, O.Gather):
        return ["any", ("index", ins[0].shape[op.axis % ins[0].rank])]
    if isinstance(op, O.ScatterUpdate):
        return ["any", "any", ("slots", ins[0].shape[0])]
    if isinstance(op, O.RopeScatter):
        return ["any"] * 4 + [("slots", ins[0].shape[0])]
    if isinstance(op, O.DynamicUpdateSlice):
        return ["any", "any", ("index", ins[0].shape[op.axis % ins[0].rank])]
    if isinstance(op, O.RopeUpdateSlice):
        return ["any"] * 4 + [("index", ins[0].shape[op.axis % ins[0].rank])]
    if isinstance(op, O.FreshKVAttention):
        return ["any"] * 8 + [("index", ins[1].shape[-2])]
    if isinstance(op, O.TransposedUpdateSlice):
        return ["any", "any", ("index", ins[0].shape[op.axis % ins[0].rank])]
    if isinstance(op, O.IndexedMatMul):
        return ["any", "any", ("index", ins[1].shape[0])]
    if isinstance(op, O.DenseRowGather):
        return ["any", ("index", ins[0].shape[0])]
    if isinstance(op, (O.PackedDequant, O.PackedContraction, O.Q8PackedContraction)):
        lead = 0 if isinstance(op, O.PackedDequant) else 1
        return ["any"] * lead + _packed(op.weight, lead, n)
    if isinstance(op, O.PackedRowGather):
        return [("index", op.weight.shape[0])] + _packed(op.weight, 1, n)
    if isinstance(op, O.IndexedPackedContraction):
        return ["any", ("index", op.experts)] + _packed(op.weight, 2, n)
    if isinstance(op, (O.DenseContraction, O.ContractionEpilogue)) and n >= 2 and \
            ins[1].dtype.name == "U32":
        from poot.formats import PackedWeight

        w = PackedWeight("dense:f16words", (ins[1].shape[0], 2 * ins[1].shape[1]))
        return ["any", ("packed", w, 0)] + ["small"] * (n - 2)
    if isinstance(op, O.SelectedAttention):
        return ["any", "any", "any", ("index", ins[1].shape[1] // op.block), "small"]
    # attention masks, region parameters, epilogue inputs: small values keep exp finite
    return ["small"] * n


__all__ = ["domains"]
