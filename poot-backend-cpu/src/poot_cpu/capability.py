"""The cpu backend's device facts: what the C compiler's types give each dtype.

* F32, I32, U32 and 8/16-bit integers (computed in int, wrapped back) everywhere.
* F16 is the compiler's `_Float16` (GCC 12+ on x86-64; conversions round to nearest
  even, F16C instructions where the CPU has them): arithmetic computes in F32 and
  rounds once per op, the IR's rule for 16-bit floats (poot.oracle.scalar).
* BF16 is storage and conversion only: gcc 12 has no BF16 arithmetic type, so it is
  held as 16-bit words, widened exactly and narrowed to nearest even by helpers;
  contractions and reductions that accumulate in F32 take it.
* 8- and 4-bit floats are storage only, as packed weights' sources (decode programs
  read their bytes as words).
The ops are the shared lowerings' (poot.codegen.coverage), derived from these facts.
"""
from __future__ import annotations

from poot.capability import CapabilityTable, Use
from poot.codegen.coverage import BYTE_FLOATS, NARROW_INTS, device_uses, kernel_table
from poot.dtypes import DType

D = DType

NOTES = {
    "bf16": "storage and conversion only (gcc 12 has no BF16 arithmetic type): 16-bit words "
            "widened exactly, narrowed to nearest even; contractions and reductions "
            "accumulate in f32",
    "f16": "_Float16: arithmetic in f32, rounded to nearest even once per op",
    "numerics": "IEEE f32 as the oracle: no fast-math, no contraction of a*b+c, "
                "subnormals kept",
}


def dtype_uses() -> dict[DType, Use]:
    return device_uses(full=(D.F32, D.I32, D.U32, D.F16), held=(D.BF16,), narrow=NARROW_INTS,
                       packed=BYTE_FLOATS)


def table(device: str, formats: frozenset) -> CapabilityTable:
    from poot_cpu.gemv import q8_formats

    # the contraction of q8 rows runs poot_cpu.gemv's byte dot products, attention over a
    # q8_0 cache (dense or paged) poot_cpu.attention's row builder (program_for)
    own = {"Q8PackedContraction": q8_formats(formats), "Q8KVAttention": {D.I8},
           "PagedQ8KVAttention": {D.I8}, "Q8KVSinkAttention": {D.I8}}
    # RopeUpdateSlice lowers through the shared kernels: declared so conformance covers it,
    # not elected (a CPU step has no batches for it to save)
    return kernel_table("cpu", device, dtype_uses(), formats, own=own,
                        declare=("RopeUpdateSlice",), notes=NOTES)
