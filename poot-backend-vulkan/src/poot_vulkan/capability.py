"""The Vulkan device facts the capability table is derived from.

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
* Q8PackedContraction (the `fast` graph's packed contraction of int8 rows) is the
  backend's own (poot.codegen.lower.q8) for formats of integer codes where the device
  has shaderIntegerDotProduct (target.DOT4); elsewhere it is refused and `fast` keeps
  the rounded rows' PackedContraction.
The ops are the shared lowerings' (poot.codegen.coverage); limits (binding range,
shared memory, workgroup size) come from the device and are checked when a kernel is
printed (poot_vulkan.glsl).
"""
from __future__ import annotations

from poot.capability import CapabilityTable, Use
from poot.codegen.coverage import BYTE_FLOATS, NARROW_INTS, SPIRV_SELECT, device_uses, kernel_table
from poot.codegen.lower.q8 import q8_formats
from poot.codegen.target import DOT4
from poot.dtypes import DType

from poot_vulkan.device import BACKEND, SUDOT_ACCELERATED, DeviceFacts, level_cuts
from poot_vulkan.glsl import supported_dtypes, target_features

D = DType

NOTES = {
    "bf16": "storage and conversion only: uint16_t bits, exact widening to f32, round-to-"
            "nearest-even narrowing; contractions and reductions accumulate in f32; no bf16 "
            "arithmetic",
    "f16": "float16_t storage and arithmetic (shaderFloat16, storageBuffer16BitAccess); "
           "each op computes in f32 and rounds once",
    "numerics": "SPIR-V lets drivers flush f32 subnormals and fuse a*b+c; exp and log are "
                "within Vulkan's ulp bounds; NaN is tested through bits (poot_isnan), so "
                "max, casts and Select keep it",
}

#: the offered fusions it lowers on every device (declared: conformance runs their cases)
OFFERED = ("NormedPackedContraction", "NormedDenseContraction", "GatedContraction",
           "RopeUpdateSlice", "FreshKVAttention")
#: those compile forms by default on a GPU: a decode step there is a chain of dependent
#: batches, each costing a barrier and a dispatch's latency, so the RMSNorm inside the
#: contractions that read it and the SwiGLU inside the gate|up GEMV remove a batch each,
#: and the rotated keys written straight to the dense cache leave the KV writes in the
#: batch of q's rotation (docs/performance.md)
ELECT = OFFERED
#: on a software device (lavapipe) the SwiGLU and the KV write (as many kernels, one batch
#: fewer a layer), not the norms: there the normed GEMV's extra workgroup reduction costs
#: more than the batch it saves (docs/performance.md). The norms stay declared; a test
#: forms them with `Policy(fuse=OFFERED)`
SOFTWARE_ELECT = ("GatedContraction", "RopeUpdateSlice", "FreshKVAttention")
#: elected only while the level cuts are on (POOT_LEVEL_CUTS=off: the A/B's before)
LEVEL_CUTS = ("FreshKVAttention",)


def elected(software: bool) -> tuple[str, ...]:
    """The fusions compile forms unasked on this kind of device."""
    elect = SOFTWARE_ELECT if software else ELECT
    return elect if level_cuts() else tuple(k for k in elect if k not in LEVEL_CUTS)


def dtype_uses(facts: DeviceFacts) -> dict[DType, Use]:
    have = supported_dtypes(facts)
    return device_uses(full=[d for d in (D.F32, D.I32, D.U32, D.F16) if d in have],
                       held=[D.BF16] if D.BF16 in have else [],
                       narrow=[d for d in NARROW_INTS if d in have], packed=BYTE_FLOATS,
                       lacking=(D.F16, D.BF16, *NARROW_INTS))


def capability_table(facts: DeviceFacts, device_id: str,
                     formats: frozenset[str]) -> CapabilityTable:
    """The table of one device with these packed formats registered."""
    uses = dtype_uses(facts)
    notes = dict(NOTES)
    for d, why in ((D.F16, "shaderFloat16 and storageBuffer16BitAccess"),
                   (D.I16, "shaderInt16 and storageBuffer16BitAccess"),
                   (D.I8, "shaderInt8 and storageBuffer8BitAccess")):
        if uses[d] == Use.NONE:
            notes[str(d)] = f"refused: the device lacks {why}"
    if facts.has("shaderIntegerDotProduct"):
        notes["dot4"] = ("int8 rows x packed integer codes by SPIR-V SUDot (shaderIntegerDotProduct"
                         + ("; the driver accelerates it)" if facts.has(SUDOT_ACCELERATED) else
                            "; the driver reports it unaccelerated)"))
    if facts.has("shaderBFloat16"):
        notes["bf16"] += " (the device's VK_KHR_shader_bfloat16 is not used yet)"
    limits = {"max_buffer_bytes": facts.limit("maxStorageBufferRange"),
              "max_shared_bytes": facts.limit("maxComputeSharedMemorySize"),
              "max_workgroup_invocations": facts.limit("maxComputeWorkGroupInvocations"),
              "subgroup_size": facts.subgroup_size}
    # the contraction of int8 rows is the backend's own where Dot4 is one instruction
    own = {"Q8PackedContraction": q8_formats(formats)} if DOT4 in target_features(facts) \
        else None
    return kernel_table(BACKEND, device_id, uses, formats, refuse={"Select": SPIRV_SELECT},
                        declare=OFFERED, elect=elected(facts.is_software),
                        own=own, limits=limits, notes=notes)
