"""The cpu backend's capability table: what the C compiler's types and the ISA support.

* F32, I32, U32 and 8/16-bit integers (computed in int, wrapped back) everywhere.
* F16 is the compiler's `_Float16` (GCC 12+ on x86-64; conversions round to nearest
  even, F16C instructions where the CPU has them): arithmetic computes in F32 and
  rounds once per op, the IR's rule for 16-bit floats (poot.oracle.scalar).
* BF16 is storage and conversion only: gcc 12 has no BF16 arithmetic type, so it is
  held as 16-bit words, widened exactly and narrowed to nearest even by helpers;
  contractions and reductions that accumulate in F32 take it.
* 8- and 4-bit floats are storage only, as packed weights' sources (decode programs
  read their bytes as words).
An op is declared only where poot.codegen has a lowering for it.
"""
from __future__ import annotations

from poot.capability import CapabilityTable, Use, every_op_key
from poot.codegen.coverage import SCAN_NOTE
from poot.dtypes import DType

D = DType
NARROW_INTS = frozenset({D.I8, D.U8, D.I16, D.U16})
BYTE_FLOATS = frozenset({D.F8E4M3, D.F8E5M2, D.F8E8M0, D.F4E2M1})
WIDE = Use.STORAGE | Use.CONVERT | Use.ARITH | Use.DOT

UNARY_FLOAT = ("Exp", "Log", "Sqrt", "Recip", "Tanh", "Erf")
BINARY_ARITH = ("Add", "Sub", "Mul", "Div", "Max", "Min", "Ge")
BINARY_BITS = ("GeU", "And", "Or", "Xor", "Shl", "Shr")
MOVES = ("Broadcast", "Reshape", "Transpose", "Slice", "Concat", "Gather", "ScatterUpdate",
         "DynamicUpdateSlice", "Cast", "Fused", "FusedRow", "Select")
PACKED = ("PackedDequant", "PackedContraction", "PackedRowGather", "IndexedPackedContraction")

NOTES = {
    "bf16": "storage and conversion only (gcc 12 has no BF16 arithmetic type): 16-bit words "
            "widened exactly, narrowed to nearest even; contractions and reductions "
            "accumulate in f32",
    "f16": "_Float16: arithmetic in f32, rounded to nearest even once per op",
    **{str(d): "held only as a packed weight's source bytes, read by its format's decode "
                "program; no op computes with it" for d in BYTE_FLOATS},
    "Reduce.Max:u32": "no unsigned accumulator for Max",
    "Scan": SCAN_NOTE,
    "numerics": "IEEE f32 as the oracle: no fast-math, no contraction of a*b+c, "
                "subnormals kept",
}


def dtype_uses() -> dict[DType, Use]:
    uses = {D.F32: WIDE, D.I32: WIDE, D.U32: WIDE, D.F16: WIDE,
            D.BF16: Use.STORAGE | Use.CONVERT | Use.DOT}
    uses.update({d: Use.STORAGE | Use.CONVERT | Use.ARITH for d in NARROW_INTS})
    uses.update({d: Use.STORAGE for d in BYTE_FLOATS})
    return uses


def op_dtypes(uses: dict[DType, Use], formats: frozenset) -> dict[str, frozenset]:
    stored = frozenset(d for d, u in uses.items() if Use.STORAGE in u) - BYTE_FLOATS
    arith = frozenset(d for d, u in uses.items() if Use.ARITH in u)
    floats = frozenset(d for d in arith if d.is_float)
    dot = frozenset(d for d, u in uses.items() if Use.DOT in u)
    ops: dict[str, frozenset] = {f"Unary.{u}": floats for u in UNARY_FLOAT}
    ops["Unary.Neg"] = floats | {D.I32}
    ops.update({f"Unary.{u}": frozenset({D.I32, D.U32}) for u in ("Not", "Clz")})
    ops.update({f"Binary.{b}": arith for b in BINARY_ARITH})
    ops.update({f"Binary.{b}": frozenset({D.I32, D.U32}) for b in BINARY_BITS})
    ops.update({m: stored for m in MOVES})
    ops["Select"] = arith
    ops["Iota"] = frozenset({D.F32, D.I32})
    ops["ArgTopK"] = arith
    ops["Reduce.Sum"] = arith - NARROW_INTS
    ops["Reduce.Max"] = arith - NARROW_INTS - {D.U32}
    ops["Rope"] = floats
    ops.update({k: dot - {D.U32} for k in ("MatMul", "IndexedMatMul", "Attention")})
    ops.update({k: frozenset(d for d in dot if d.is_float)
                for k in ("BlockTopK", "SelectedAttention")})
    ops["Scan"] = stored
    ops["DenseContraction"] = dot - {D.I32}          # u32: f16 values two to a word
    ops["ContractionEpilogue"] = dot - {D.I32}
    ops["GroupedDenseContraction"] = frozenset({D.BF16})
    ops["DenseRowGather"] = frozenset({D.BF16})
    ops["QuantizeI8"] = frozenset({D.F32})
    ops.update({k: formats for k in PACKED})
    return ops


def table(device: str, formats: frozenset) -> CapabilityTable:
    from poot.codegen.lower import LOWERINGS

    lowered = {cls.__name__ for cls in LOWERINGS} | {"Reshape"}   # Reshape is an alias
    keys = set(every_op_key())
    ops = {k: v for k, v in op_dtypes(dtype_uses(), formats).items()
           if k in keys and k.split(".")[0] in lowered}
    return CapabilityTable.declare("cpu", device, dtype_uses(), ops, notes=NOTES)
