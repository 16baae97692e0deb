"""The Vulkan capability table, read from the device's features.

* F32, I32, U32 on every device; F16 with shaderFloat16 and 16-bit storage; I16/U16
  with shaderInt16 and 16-bit storage; I8/U8 with shaderInt8 and 8-bit storage.
  Without the feature the dtype is refused everywhere (never emulated).
* BF16 is storage and conversion only (16 bits in a uint16_t, widened exactly to f32,
  rounded to nearest even on store): ops that move it, convert it or accumulate it in
  f32 (contractions, reductions) take it; Unary/Binary refuse it. A device with a
  bfloat16 extension reports it in the table's notes; no kernel uses it yet.
* Select on F16 and BF16 is refused with DtypeLowering: the IR specification's rule
  for SPIR-V targets.
* 8- and 4-bit floats are storage only: packed weights' source bytes, read as u32
  words by their format's decode program.
An op is declared only where poot.codegen has a lowering for it; limits (binding
range, shared memory, workgroup size) come from the device and are checked when a
kernel is printed (poot_vulkan.glsl).
"""
from __future__ import annotations

from poot.capability import CapabilityTable, Use, every_op_key
from poot.codegen.coverage import SCAN_NOTE
from poot.dtypes import DType
from poot.ir.ops import BinaryOp, UnaryOp

from poot_vulkan.device import BACKEND, DeviceFacts
from poot_vulkan.glsl import supported_dtypes

D = DType
NARROW_INTS = frozenset({D.I8, D.U8, D.I16, D.U16})
BYTE_FLOATS = frozenset({D.F8E4M3, D.F8E5M2, D.F8E8M0, D.F4E2M1})
# op families from the sub-ops' own traits
FLOAT_UNARY = UnaryOp.keys(lambda u: not u.bitwise)
BIT_UNARY = UnaryOp.keys(lambda u: u.bitwise)
ARITH_BINARY = BinaryOp.keys(lambda b: not b.bitwise)
BIT_BINARY = BinaryOp.keys(lambda b: b.bitwise)
MOVEMENT = ("Broadcast", "Reshape", "Transpose", "Slice", "Concat", "Gather", "ScatterUpdate",
            "DynamicUpdateSlice", "Cast", "Fused", "FusedRow")
PACKED = ("PackedContraction", "PackedRowGather", "IndexedPackedContraction")


def dtype_uses(facts: DeviceFacts) -> dict[DType, Use]:
    have = supported_dtypes(facts)
    wide = Use.STORAGE | Use.CONVERT | Use.ARITH | Use.DOT
    uses = {D.F32: wide, D.I32: wide, D.U32: wide}
    uses[D.F16] = wide if D.F16 in have else Use.NONE
    uses[D.BF16] = Use.STORAGE | Use.CONVERT | Use.DOT if D.BF16 in have else Use.NONE
    for d in NARROW_INTS:
        uses[d] = Use.STORAGE | Use.CONVERT | Use.ARITH if d in have else Use.NONE
    for d in BYTE_FLOATS:
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
    table["Select"] = arith - {D.F16, D.BF16}
    table["Iota"] = frozenset({D.F32, D.I32})
    table.update({op: stored for op in MOVEMENT})
    table["ArgTopK"] = arith
    table["Reduce.Sum"] = arith - NARROW_INTS
    table["Reduce.Max"] = arith - NARROW_INTS - {D.U32}
    table["Rope"] = floats
    table["RopeScatter"] = floats    # Rope's kernel writing the KV pool rows
    table.update({op: dot - {D.U32}
                  for op in ("MatMul", "IndexedMatMul", "Attention", "PagedAttention")})
    table.update({op: frozenset(d for d in dot if d.is_float)
                  for op in ("BlockTopK", "SelectedAttention")})
    table["Scan"] = stored
    table["DenseContraction"] = dot - {D.I32}  # u32: f16 values two to a word
    table["GroupedDenseContraction"] = frozenset({D.BF16}) & dot
    table["DenseRowGather"] = frozenset({D.BF16}) & dot
    table["QuantizeI8"] = frozenset({D.F32})
    table["ContractionEpilogue"] = dot - {D.I32}
    return table


NOTES = {
    "Select:f16": "Select on F16 is not lowered on SPIR-V targets (the IR spec's rule)",
    "Select:bf16": "Select on BF16 is not lowered on SPIR-V targets (the IR spec's rule)",
    "bf16": "storage and conversion only: uint16_t bits, exact widening to f32, round-to-"
            "nearest-even narrowing; contractions and reductions accumulate in f32; no bf16 "
            "arithmetic",
    "f16": "float16_t storage and arithmetic (shaderFloat16, storageBuffer16BitAccess); "
           "each op computes in f32 and rounds once",
    **{str(d): "held only as a packed weight's source bytes, which its format's decode "
                "program reads as u32 words; no op computes with it" for d in BYTE_FLOATS},
    "Reduce.Max:u32": "no unsigned accumulator for Max",
    "MatMul:u32": "u32 is a contraction operand only as DenseContraction's f16 words",
    "Scan": SCAN_NOTE,
    "numerics": "SPIR-V lets drivers flush f32 subnormals and fuse a*b+c; exp and log are "
                "within Vulkan's ulp bounds; NaN is tested through bits (poot_isnan), so "
                "max, casts and Select keep it",
}


def capability_table(facts: DeviceFacts, device_id: str,
                     formats: frozenset[str]) -> CapabilityTable:
    """The table of one device with these packed formats registered, declaring only the
    ops poot.codegen can lower."""
    from poot.codegen.lower import LOWERINGS

    uses = dtype_uses(facts)
    lowered = {cls.__name__ for cls in LOWERINGS} | {"Reshape"}  # Reshape is an alias
    keys = set(every_op_key())
    table = op_dtypes(uses)
    for op in PACKED:
        table[op] = frozenset(formats)
    ops = {k: v for k, v in table.items() if k in keys and k.split(".")[0] in lowered}
    notes = dict(NOTES)
    for d, why in ((D.F16, "shaderFloat16 and storageBuffer16BitAccess"),
                   (D.I16, "shaderInt16 and storageBuffer16BitAccess"),
                   (D.I8, "shaderInt8 and storageBuffer8BitAccess")):
        if uses[d] == Use.NONE:
            notes[str(d)] = f"refused: the device lacks {why}"
    if facts.has("shaderBFloat16"):
        notes["bf16"] += " (the device's VK_KHR_shader_bfloat16 is not used yet)"
    limits = {"max_buffer_bytes": facts.limit("maxStorageBufferRange"),
              "max_shared_bytes": facts.limit("maxComputeSharedMemorySize"),
              "max_workgroup_invocations": facts.limit("maxComputeWorkGroupInvocations"),
              "subgroup_size": facts.subgroup_size}
    return CapabilityTable.declare(BACKEND, device_id, uses, ops, limits, notes)
