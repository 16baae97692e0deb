"""How each poot dtype lives in WGSL: its register type and its storage layout.

WGSL has f32, i32, u32 and (with `shader-f16`) f16; nothing narrower. So:
* F32, I32, U32, F16 are native in registers and in storage arrays;
* BF16 is storage-and-conversion only: 16-bit halves of u32 words in storage, an f32
  register holding a bf16-exact value (a Cast to BF16 rounds it); no BF16 arithmetic;
* I8/I16 (U8/U16) are 8/16-bit fields of u32 words in storage and i32 (u32) registers,
  wrapped back to their width after each arithmetic op;
* the 8- and 4-bit floats are not lowered (quant formats decode them from u32 words).
"""
from __future__ import annotations

from dataclasses import dataclass

from poot.dtypes import DType
from poot.errors import DtypeLowering

BACKEND = "wgpu"


@dataclass(frozen=True)
class Layout:
    register: str      # WGSL type of a value in a register
    element: str       # WGSL element type of a storage array
    packed_bits: int   # 0: one element per array slot; else bits per field of a u32 word

    @property
    def per_word(self) -> int:
        return 32 // self.packed_bits if self.packed_bits else 1


LAYOUTS: dict[DType, Layout] = {
    DType.F32: Layout("f32", "f32", 0),
    DType.I32: Layout("i32", "i32", 0),
    DType.U32: Layout("u32", "u32", 0),
    DType.F16: Layout("f16", "f16", 0),
    DType.BF16: Layout("f32", "u32", 16),
    DType.I16: Layout("i32", "u32", 16),
    DType.U16: Layout("u32", "u32", 16),
    DType.I8: Layout("i32", "u32", 8),
    DType.U8: Layout("u32", "u32", 8),
}

#: dtypes whose arithmetic (Unary/Binary) the printer lowers, besides the F16 feature rule
ARITHMETIC = frozenset({DType.F32, DType.I32, DType.U32, DType.F16, DType.I16, DType.U16,
                        DType.I8, DType.U8})


def layout(dtype: DType, features: frozenset[str], device: str, op: str = "") -> Layout:
    """The layout of `dtype` on a device with `features`, or the typed refusal."""
    if dtype is DType.F16 and "shader-f16" not in features:
        raise DtypeLowering("f16 needs the adapter's shader-f16 feature", op=op, dtype="f16",
                            backend=BACKEND, device=device)
    try:
        return LAYOUTS[dtype]
    except KeyError:
        raise DtypeLowering(f"{dtype} has no WGSL lowering (8/4-bit floats are decoded from "
                            f"u32 words by their format's decode program)", op=op,
                            dtype=str(dtype), backend=BACKEND, device=device) from None


def is_wide_float(dtype: DType) -> bool:
    """Floats whose register is f32 (F32 itself and the storage-only BF16)."""
    return dtype in (DType.F32, DType.BF16)
