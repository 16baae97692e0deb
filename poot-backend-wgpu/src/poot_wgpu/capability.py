"""The wgpu backend's capability table, read from the adapter's features.

Declared, then proven by the tests on lavapipe (tests/test_wgpu_lowerings.py):
* F32 always; I32/U32 with the bit ops; 8/16-bit integers in u32 words.
* F16 (storage, conversion, arithmetic, dot) only with the adapter's `shader-f16`
  feature; without it F16 is refused everywhere (no silent emulation).
* BF16 is storage and conversion only: 16-bit halves of u32 words, widened exactly
  to f32 on load, rounded to nearest even on store. Ops that only move, convert, or
  accumulate in f32 (contractions, reductions) take it; Unary/Binary/Select refuse it.
* Select on F16 and BF16 is refused (DtypeLowering): the spec's rule for SPIR-V targets.
* 8- and 4-bit floats are storage only, as packed weights' sources: the format's decode
  program reads their bytes as u32 words; no op computes with or moves them.
An op is declared only where poot.codegen has a lowering for it.
"""
from __future__ import annotations

from poot.capability import CapabilityTable, Use, every_op_key
from poot.codegen.coverage import SCAN_NOTE
from poot.dtypes import DType
from poot.ir.ops import BinaryOp, UnaryOp

from poot_wgpu.device import WgpuDevice
from poot_wgpu.wgsl.types import BACKEND

D = DType
NARROW_INTS = frozenset({D.I8, D.U8, D.I16, D.U16})
BYTE_FLOATS = frozenset({D.F8E4M3, D.F8E5M2, D.F8E8M0, D.F4E2M1})
# op families from the sub-ops' own traits
FLOAT_UNARY = UnaryOp.keys(lambda u: not u.bitwise)
BIT_UNARY = UnaryOp.keys(lambda u: u.bitwise)
ARITH_BINARY = BinaryOp.keys(lambda b: not b.bitwise)
BIT_BINARY = BinaryOp.keys(lambda b: b.bitwise)
MOVEMENT = ("Broadcast", "Reshape", "Transpose", "Slice", "Concat", "Gather", "ScatterUpdate",
            "DynamicUpdateSlice", "Cast", "Fused")


def dtype_uses(dev: WgpuDevice) -> dict[DType, Use]:
    wide = Use.STORAGE | Use.CONVERT | Use.ARITH | Use.DOT
    # u32 is a dot operand only as DenseContraction's weight words (two f16 values each)
    uses = {D.F32: wide, D.I32: wide, D.U32: wide,
            D.BF16: Use.STORAGE | Use.CONVERT | Use.DOT}
    uses.update({d: Use.STORAGE | Use.CONVERT | Use.ARITH for d in NARROW_INTS})
    uses[D.F16] = wide if dev.has("shader-f16") else Use.NONE
    for d in BYTE_FLOATS:  # held only as packed sources, read as u32 words by decode programs
        uses[d] = Use.STORAGE
    return uses


def op_dtypes(uses: dict[DType, Use]) -> dict[str, frozenset]:
    stored = frozenset(d for d, u in uses.items() if Use.STORAGE in u) - BYTE_FLOATS
    arith = frozenset(d for d, u in uses.items() if Use.ARITH in u)
    floats = frozenset(d for d in arith if d.is_float)
    dot = frozenset(d for d, u in uses.items() if Use.DOT in u)
    table: dict[str, frozenset] = {}
    table.update(dict.fromkeys(FLOAT_UNARY, floats))
    table["Unary.Neg"] = floats | {D.I32}
    table.update(dict.fromkeys(BIT_UNARY + BIT_BINARY, frozenset({D.I32, D.U32})))
    table.update(dict.fromkeys(ARITH_BINARY, arith))
    table["Select"] = arith - {D.F16}
    table["Iota"] = frozenset({D.F32, D.I32})
    table.update({op: stored for op in MOVEMENT})
    table["ArgTopK"] = arith
    table["Reduce.Sum"] = arith - NARROW_INTS
    table["Reduce.Max"] = arith - NARROW_INTS - {D.U32}
    table["FusedRow"] = stored
    table["Rope"] = floats - {D.F16}  # its lowering selects in the element dtype (see NOTES)
    table["RopeScatter"] = table["Rope"]   # Rope's kernel writing the KV pool rows
    table.update({op: dot - {D.U32}
                  for op in ("MatMul", "IndexedMatMul", "Attention", "PagedAttention")})
    table.update({op: frozenset(d for d in dot if d.is_float)
                  for op in ("BlockTopK", "SelectedAttention")})
    table["Scan"] = stored
    table["DenseContraction"] = dot - {D.I32}  # u32: f16 values two to a word
    table["GroupedDenseContraction"] = frozenset({D.BF16})
    table["DenseRowGather"] = frozenset({D.BF16})
    table["QuantizeI8"] = frozenset({D.F32})
    table["ContractionEpilogue"] = dot - {D.I32}
    return table


NOTES = {
    "Select:f16": "Select on F16 is not lowered on SPIR-V targets (the IR spec's rule)",
    "Select:bf16": "Select on BF16 is not lowered on SPIR-V targets (the IR spec's rule)",
    "bf16": "storage and conversion only: u32 words, exact widening to f32, round-to-nearest-"
            "even narrowing; contractions and reductions accumulate in f32; no bf16 arithmetic",
    "f16": "needs the adapter's shader-f16 feature; arithmetic widens to f32 and rounds back "
           "once per op",
    **{str(d): "held only as a packed weight's source bytes, which its format's decode "
                "program reads as u32 words; no op computes with it" for d in BYTE_FLOATS},
    "Reduce.Max:u32": "no signed accumulator for u32 Max",
    "Rope:f16": "poot.codegen's Rope kernel selects in the element dtype, and Select on F16 "
                "is refused on SPIR-V targets",
    "RopeScatter:f16": "the same Rope kernel, writing the KV pool rows",
    "MatMul:u32": "u32 is a contraction operand only as DenseContraction's f16 words",
    "Scan": SCAN_NOTE,
    "numerics": "WGSL lets compilers assume finite math: NaN/Inf through float arithmetic is "
                "not guaranteed (lavapipe folds x*0 to 0); Select, casts and Max keep them "
                "bit for bit; exp is within Vulkan's 3+2|x| ulp; f32 subnormals may be "
                "flushed to zero (Vulkan allows it: the H200's driver flushes, lavapipe keeps "
                "them), and a*b+c may be fused",
}


def capability_table(dev: WgpuDevice, device_id: str, formats: frozenset[str]) \
        -> CapabilityTable:
    """The table of `dev`, declaring only the ops poot.codegen can lower; every registered
    packed format (`formats`) decodes in-kernel (its decode program is printed in)."""
    from poot.codegen.lower import LOWERINGS

    uses = dtype_uses(dev)
    lowered = {cls.__name__ for cls in LOWERINGS} | {"Reshape"}  # Reshape is an alias
    keys = set(every_op_key())
    table = op_dtypes(uses)
    for op in ("PackedContraction", "PackedRowGather", "IndexedPackedContraction"):
        table[op] = frozenset(formats)
    ops = {k: v for k, v in table.items() if k in keys and k.split(".")[0] in lowered}
    notes = dict(NOTES)
    if uses[D.F16] == Use.NONE:
        notes["f16"] = "refused: the adapter lacks the shader-f16 feature"
    limits = dict(dev.limits)
    limits["max_buffer_bytes"] = dev.limit("max-storage-buffer-binding-size")
    return CapabilityTable.declare(BACKEND, device_id, uses, ops, limits, notes)
