"""The ROCm capability table of one target (an architecture at one wavefront width).

poot's kernels compute 16-bit floats in F32 and round once per op (the IR's rule),
and decode packed weights with integer ops, so every architecture here computes
with F32, F16 and BF16 and reads every registered packed format; what differs is
the LDS limit, the wavefront width the kernels are printed for, and whether FP8
buffers may be held (architectures with FP8 conversions, CDNA3 on). The dot and
matrix-unit facts of `poot_rocm.archs` are reported, not used by a schedule yet.
"""
from __future__ import annotations

from poot.capability import CapabilityTable, Use, op_keys
from poot.dtypes import DType

from poot_rocm.archs import Target

F32, F16, BF16, I32, U32 = DType.F32, DType.F16, DType.BF16, DType.I32, DType.U32
SMALL = {DType.I8, DType.U8, DType.I16, DType.U16}
INTS = {I32, U32}
ALL_WORDS = INTS | SMALL
FLOATS = {F32, F16, BF16}

FLOAT_UNARY = ("Unary.Neg", "Unary.Exp", "Unary.Log", "Unary.Sqrt", "Unary.Recip", "Unary.Tanh",
               "Unary.Erf")
ARITH_BINARY = ("Binary.Add", "Binary.Sub", "Binary.Mul", "Binary.Div", "Binary.Max",
                "Binary.Ge")
BIT_BINARY = ("Binary.GeU", "Binary.And", "Binary.Or", "Binary.Xor", "Binary.Shl", "Binary.Shr")
MOVES = ("Broadcast", "Reshape", "Transpose", "Slice", "Concat", "Gather", "ScatterUpdate",
         "DynamicUpdateSlice", "Select", "Cast", "Fused", "FusedRow", "ContractionEpilogue",
         "Reduce.Sum")
PACKED = ("PackedDequant", "PackedContraction", "PackedRowGather", "IndexedPackedContraction")


def facts(t: Target) -> dict:
    """What `poot backends` and the docs report for a target."""
    a = t.arch
    return {"arch": a.name, "family": a.family, "wavefront": t.wave, "lds_bytes": a.lds_bytes,
            "f16_arith": True, "bf16_arith": True, "f16_dot": a.f16_dot, "bf16_dot": a.bf16_dot,
            "int8_dot": a.int8_dot, "matrix_units": a.matrix or "none", "fp8_storage": a.fp8}


def table(device: str, t: Target, formats) -> CapabilityTable:
    dtypes = {d: Use.all() for d in FLOATS}
    dtypes.update({d: Use.STORAGE | Use.CONVERT | Use.ARITH | Use.DOT for d in INTS})
    dtypes.update({d: Use.STORAGE | Use.CONVERT | Use.ARITH for d in SMALL})
    if t.arch.fp8:
        dtypes.update({DType.F8E4M3: Use.STORAGE, DType.F8E5M2: Use.STORAGE})
    ops: dict[str, set] = {}
    ops.update({k: set(FLOATS) for k in FLOAT_UNARY})
    ops["Unary.Neg"] |= {I32}
    ops.update({k: set(INTS) for k in ("Unary.Not", "Unary.Clz", *BIT_BINARY)})
    ops.update({k: FLOATS | ALL_WORDS for k in ARITH_BINARY + MOVES})
    ops["Reduce.Max"] = FLOATS | {I32} | SMALL
    ops["Iota"] = {F32, I32}
    ops["ArgTopK"] = FLOATS | {I32}
    ops.update({k: FLOATS | {I32} for k in ("MatMul", "IndexedMatMul")})
    ops.update({k: set(FLOATS) for k in ("Attention", "Rope")})
    ops["DenseContraction"] = {F32, F16, BF16, U32}
    ops["GroupedDenseContraction"] = {BF16}
    ops["DenseRowGather"] = {BF16}
    ops.update({k: set(formats) for k in PACKED})
    known = set(op_keys(*sorted({k.split(".")[0] for k in ops})))
    notes = {"Scan": "Scan is evaluated by its primitive definition; no rocm kernel",
             "AllReduce": "collectives are cuts between stages",
             "AllGather": "collectives are cuts between stages",
             "BlockTopK": "no rocm kernel for sparse block selection yet",
             "SelectedAttention": "no rocm kernel for sparse attention yet",
             "Reduce.Max:u32": "no unsigned accumulator for Max"}
    return CapabilityTable.declare("rocm", device, dtypes,
                                   {k: v for k, v in ops.items() if k in known},
                                   limits={"lds_bytes": t.arch.lds_bytes}, notes=notes)
