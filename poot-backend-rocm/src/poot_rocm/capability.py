"""The ROCm capability table of one target (an architecture at one wavefront width).

poot's kernels compute 16-bit floats in F32 and round once per op (the IR's rule),
and decode packed weights with integer ops, so every architecture here computes
with F32, F16 and BF16 and reads every registered packed format; what differs is
the LDS limit, the wavefront width the kernels are printed for, and whether FP8
buffers may be held (architectures with FP8 conversions, CDNA3 on). The dot and
matrix-unit facts of `poot_rocm.archs` are reported, not used by a schedule yet.
"""
from __future__ import annotations

from poot.capability import CapabilityTable
from poot.codegen.coverage import NARROW_INTS, device_uses, kernel_table
from poot.dtypes import DType

from poot_rocm.archs import Target

F32, F16, BF16 = DType.F32, DType.F16, DType.BF16
FLOATS = (F32, F16, BF16)


def facts(t: Target) -> dict:
    """What `poot backends` and the docs report for a target."""
    a = t.arch
    return {"arch": a.name, "family": a.family, "wavefront": t.wave, "lds_bytes": a.lds_bytes,
            "f16_arith": True, "bf16_arith": True, "f16_dot": a.f16_dot, "bf16_dot": a.bf16_dot,
            "int8_dot": a.int8_dot, "matrix_units": a.matrix or "none", "fp8_storage": a.fp8}


def table(device: str, t: Target, formats) -> CapabilityTable:
    fp8 = (DType.F8E4M3, DType.F8E5M2) if t.arch.fp8 else ()
    dtypes = device_uses(full=FLOATS + (DType.I32, DType.U32), narrow=NARROW_INTS, packed=fp8)
    return kernel_table("rocm", device, dtypes, formats, limits={"lds_bytes": t.arch.lds_bytes})
