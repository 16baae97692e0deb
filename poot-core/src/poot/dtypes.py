"""Element types of the IR and their numpy representations.

A DType is what a tensor holds; `numpy_dtype` is how the oracle stores it
(BF16 and the 8/4-bit floats through ml_dtypes). The categories drive the
type rules of the ops and the capability tables of the backends.
"""
from __future__ import annotations

import enum

import ml_dtypes
import numpy as np


class DType(enum.Enum):
    F32 = "f32"
    F16 = "f16"
    BF16 = "bf16"
    F8E4M3 = "f8e4m3"
    F8E5M2 = "f8e5m2"
    F8E8M0 = "f8e8m0"    # MXFP4 shared exponent scale
    F4E2M1 = "f4e2m1"    # NVFP4 / MXFP4 element (one per byte when unpacked)
    I32 = "i32"
    U32 = "u32"
    I16 = "i16"
    U16 = "u16"
    I8 = "i8"
    U8 = "u8"

    # -- categories ----------------------------------------------------
    @property
    def is_float(self) -> bool:
        return self in _FLOATS

    @property
    def is_int(self) -> bool:
        return not self.is_float

    @property
    def is_signed(self) -> bool:
        return self in (DType.I32, DType.I16, DType.I8) or self.is_float

    @property
    def itemsize(self) -> int:
        return np.dtype(self.numpy).itemsize

    @property
    def bits(self) -> int:
        return 4 if self is DType.F4E2M1 else 8 * self.itemsize

    @property
    def numpy(self) -> np.dtype:
        return _NUMPY[self]

    def __repr__(self) -> str:
        return self.value

    __str__ = __repr__

    @classmethod
    def parse(cls, name: str | DType) -> DType:
        """The DType named `name` (`"f32"`, `"bf16"`, ...); a typed error otherwise."""
        if isinstance(name, DType):
            return name
        try:
            return cls(str(name).lower())
        except ValueError:
            from poot.errors import DtypeError

            known = ", ".join(d.value for d in cls)
            raise DtypeError(f"unknown dtype {name!r}; known dtypes: {known}") from None

    @classmethod
    def of(cls, array: np.ndarray) -> DType:
        """The DType of a numpy array (a typed error for float64, bool, ...)."""
        for d, npd in _NUMPY.items():
            if array.dtype == npd:
                return d
        from poot.errors import DtypeError

        raise DtypeError(f"numpy dtype {array.dtype} has no poot DType; cast it first")


_FLOATS = frozenset(
    {DType.F32, DType.F16, DType.BF16, DType.F8E4M3, DType.F8E5M2, DType.F8E8M0, DType.F4E2M1}
)

_NUMPY = {
    DType.F32: np.dtype(np.float32),
    DType.F16: np.dtype(np.float16),
    DType.BF16: np.dtype(ml_dtypes.bfloat16),
    DType.F8E4M3: np.dtype(ml_dtypes.float8_e4m3fn),
    DType.F8E5M2: np.dtype(ml_dtypes.float8_e5m2),
    DType.F8E8M0: np.dtype(ml_dtypes.float8_e8m0fnu),
    DType.F4E2M1: np.dtype(ml_dtypes.float4_e2m1fn),
    DType.I32: np.dtype(np.int32),
    DType.U32: np.dtype(np.uint32),
    DType.I16: np.dtype(np.int16),
    DType.U16: np.dtype(np.uint16),
    DType.I8: np.dtype(np.int8),
    DType.U8: np.dtype(np.uint8),
}

F32, F16, BF16 = DType.F32, DType.F16, DType.BF16
F8E4M3, F8E5M2, F8E8M0, F4E2M1 = DType.F8E4M3, DType.F8E5M2, DType.F8E8M0, DType.F4E2M1
I32, U32, I16, U16, I8, U8 = DType.I32, DType.U32, DType.I16, DType.U16, DType.I8, DType.U8
