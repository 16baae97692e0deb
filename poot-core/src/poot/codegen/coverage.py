"""What the shared lowerings (poot.codegen.lower) make kernels for, by capability key.

A backend that prints poot's kernel programs (CUDA, HIP) lowers exactly these ops; its
capability table declares them for the float dtypes its device computes with (16-bit
floats compute in F32 and round per op, the IR's rule) and the packed formats
registered. What differs per device (FP8 storage, missing BF16, limits) stays in the
backend's own table.
"""
from __future__ import annotations

from poot.capability import op_keys
from poot.dtypes import DType
from poot.ir.ops import BinaryOp, UnaryOp

F32, F16, BF16, I32, U32 = DType.F32, DType.F16, DType.BF16, DType.I32, DType.U32
SMALL = {DType.I8, DType.U8, DType.I16, DType.U16}
INTS = {I32, U32}
ALL_WORDS = INTS | SMALL

# op families from the sub-ops' own traits
FLOAT_UNARY = UnaryOp.keys(lambda u: not u.bitwise)
BIT_UNARY = UnaryOp.keys(lambda u: u.bitwise)
ARITH_BINARY = BinaryOp.keys(lambda b: not b.bitwise)
BIT_BINARY = BinaryOp.keys(lambda b: b.bitwise)
MOVES = ("Broadcast", "Reshape", "Transpose", "Slice", "Concat", "Gather", "ScatterUpdate",
         "DynamicUpdateSlice", "Select", "Cast", "Fused", "FusedRow", "ContractionEpilogue",
         "Reduce.Sum")
SCAN_NOTE = ("one kernel looping over the steps; its body eqns are checked as a region's, "
             "and a body with a reduction or contraction is refused (UnsupportedOp)")
PACKED = ("PackedDequant", "PackedContraction", "PackedRowGather", "IndexedPackedContraction")


def kernel_ops(floats: set, formats) -> dict[str, set]:
    """Op key -> dtypes (or packed format names) the lowerings make kernels for, on a
    device computing with `floats`."""
    floats = set(floats)
    ops: dict[str, set] = {}
    ops.update({k: set(floats) for k in FLOAT_UNARY})
    ops["Unary.Neg"] |= {I32}
    ops.update({k: set(INTS) for k in BIT_UNARY + BIT_BINARY})
    ops.update({k: floats | ALL_WORDS for k in ARITH_BINARY + MOVES})
    ops["Reduce.Max"] = floats | {I32} | SMALL
    ops["Iota"] = {F32, I32}
    ops["ArgTopK"] = floats | {I32}
    ops.update({k: floats | {I32} for k in ("MatMul", "IndexedMatMul")})
    ops.update({k: set(floats) for k in ("Attention", "PagedAttention", "Rope", "RopeScatter",
                                        "BlockTopK", "SelectedAttention")})
    ops["Scan"] = floats | ALL_WORDS
    ops["DenseContraction"] = {F32, F16, U32} | ({BF16} & floats)
    ops["GroupedDenseContraction"] = {BF16} & floats
    ops["DenseRowGather"] = {BF16} & floats
    ops["QuantizeI8"] = {F32}
    ops.update({k: set(formats) for k in PACKED})
    known = set(op_keys(*sorted({k.split(".")[0] for k in ops})))
    return {k: v for k, v in ops.items() if k in known}


def kernel_notes(backend: str) -> dict[str, str]:
    """Why the ops the lowerings leave out are refused."""
    return {"AllReduce": "collectives are cuts between stages",
            "AllGather": "collectives are cuts between stages",
            "Scan": SCAN_NOTE,
            "Reduce.Max:u32": "no unsigned accumulator for Max"}


__all__ = ["kernel_ops", "kernel_notes", "SCAN_NOTE", "ALL_WORDS", "INTS", "SMALL"]
