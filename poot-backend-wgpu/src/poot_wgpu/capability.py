"""The wgpu adapter facts the capability table is derived from.

Declared, then proven by the tests on lavapipe (tests/test_wgpu_lowerings.py):
* F32 always; I32/U32 with the bit ops; 8/16-bit integers in u32 words.
* F16 (storage, conversion, arithmetic, dot) only with the adapter's `shader-f16`
  feature; without it F16 is refused everywhere (no silent emulation).
* With the adapter's `subgroup` feature, reductions over a whole workgroup use subgroup
  operations (the printer); without it they are trees, and nothing is refused.
* BF16 is storage and conversion only: 16-bit halves of u32 words, widened exactly
  to f32 on load, rounded to nearest even on store. Ops that only move, convert, or
  accumulate in f32 (contractions, reductions) take it; Unary/Binary/Select refuse it.
* The printer selects in no 16-bit float (the spec's rule for SPIR-V targets): Select
  on F16 and BF16, and every op whose kernels select in the element dtype (Rope), are
  refused (DtypeLowering).
* 8- and 4-bit floats are storage only, as packed weights' sources: the format's decode
  program reads their bytes as u32 words; no op computes with or moves them.
* Q8PackedContraction (the `fast` graph's packed contraction of int8 rows) is the
  backend's own (poot.codegen.lower.q8) for formats of integer codes where WGSL has
  dot4I8Packed (target.DOT4, poot_wgpu.device.language_features); elsewhere it is
  refused and `fast` keeps the rounded rows' PackedContraction.
The ops are the shared lowerings' (poot.codegen.coverage), derived from these facts.
"""
from __future__ import annotations

from poot.capability import CapabilityTable, Use
from poot.codegen.coverage import BYTE_FLOATS, NARROW_INTS, SPIRV_SELECT, device_uses, kernel_table
from poot.codegen.lower.q8 import q8_formats
from poot.codegen.target import DOT4
from poot.dtypes import DType

from poot_wgpu.device import WgpuDevice, target_features
from poot_wgpu.env import level_cuts
from poot_wgpu.wgsl.types import BACKEND

D = DType

NOTES = {
    "bf16": "storage and conversion only: u32 words, exact widening to f32, round-to-nearest-"
            "even narrowing; contractions and reductions accumulate in f32; no bf16 arithmetic",
    "f16": "needs the adapter's shader-f16 feature; arithmetic widens to f32 and rounds back "
           "once per op",
    "numerics": "WGSL lets compilers assume finite math: NaN/Inf through float arithmetic is "
                "not guaranteed (lavapipe folds x*0 to 0); Select, casts and Max keep them "
                "bit for bit; exp is within Vulkan's 3+2|x| ulp; f32 subnormals may be "
                "flushed to zero (Vulkan allows it: the H200's driver flushes, lavapipe keeps "
                "them), and a*b+c may be fused",
}

#: the offered fusions it lowers on every adapter (declared: conformance runs their cases)
OFFERED = ("NormedPackedContraction", "NormedDenseContraction", "GatedContraction",
           "RopeUpdateSlice", "FreshKVAttention")
#: those compile forms by default on a GPU: a step's dispatches that share a buffer wait
#: for each other, and each costs its encoding, so the RMSNorm inside the contractions that
#: read it and the SwiGLU inside the gate|up GEMV remove a dispatch each, and the rotated
#: keys written straight to the dense cache no longer wait for q's rotation; the attention
#: over the step's own rows drops q's rotation (a dispatch; its waits stay as many: the
#: two cache writes after the attention each wait for it, wgpu ordering by whole buffer)
#: (docs/performance.md)
ELECT = OFFERED
#: on a CPU adapter (lavapipe) the SwiGLU and the KV write (as many dispatches), not the
#: norms: there the normed GEMV's extra workgroup reduction costs more than the dispatch it
#: saves (docs/performance.md); nor the attention over the step's own rows: after the split
#: attention's merge there each cache write adds a wait. The norms stay declared; a test
#: forms them with `Policy(fuse=OFFERED)`
SOFTWARE_ELECT = ("GatedContraction", "RopeUpdateSlice")
#: elected only while the level cuts are on (POOT_LEVEL_CUTS=off: the A/B's before)
LEVEL_CUTS = ("FreshKVAttention",)


def elected(software: bool) -> tuple[str, ...]:
    """The fusions compile forms unasked on this kind of device."""
    elect = SOFTWARE_ELECT if software else ELECT
    return elect if level_cuts() else tuple(k for k in elect if k not in LEVEL_CUTS)


def dtype_uses(dev: WgpuDevice) -> dict[DType, Use]:
    # u32 is a dot operand only as DenseContraction's weight words (two f16 values each)
    f16 = (D.F16,) if dev.has("shader-f16") else ()
    return device_uses(full=(D.F32, D.I32, D.U32, *f16), held=(D.BF16,), narrow=NARROW_INTS,
                       packed=BYTE_FLOATS, lacking=(D.F16,))


def capability_table(dev: WgpuDevice, device_id: str, formats: frozenset[str]) \
        -> CapabilityTable:
    """The table of `dev`; every registered packed format (`formats`) decodes in-kernel
    (its decode program is printed in)."""
    uses = dtype_uses(dev)
    notes = dict(NOTES)
    if uses[D.F16] == Use.NONE:
        notes["f16"] = "refused: the adapter lacks the shader-f16 feature"
    notes["subgroups"] = (
        "a Sum or integer Max over a whole workgroup folds subgroup partials (the adapter's "
        "subgroup feature); other reductions are workgroup-memory trees"
        if dev.has("subgroup") else
        "every reduction is a workgroup-memory tree: the adapter lacks the subgroup feature")
    limits = dict(dev.limits)
    limits["max_buffer_bytes"] = dev.limit("max-storage-buffer-binding-size")
    # the contraction of int8 rows is the backend's own where Dot4 is one instruction
    own = {"Q8PackedContraction": q8_formats(formats)} if DOT4 in target_features(dev) \
        else None
    return kernel_table(BACKEND, device_id, uses, formats, no_select=SPIRV_SELECT,
                        declare=OFFERED, elect=elected(dev.is_software),
                        own=own, limits=limits, notes=notes)
