"""Element types of the IR and their numpy representations.

A DType is what a tensor holds; `numpy` is how the oracle stores it
(BF16 and the 8/4-bit floats through ml_dtypes, imported on first use: a process
that never holds such an array, such as a GGUF model on the cpu backend, does not
pay for the library). The categories drive the type rules of the ops and the
capability tables of the backends.
"""
from __future__ import annotations

import enum
import sys

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
        size = _ML_ITEMSIZE.get(self)
        return size if size is not None else _NUMPY[self].itemsize

    @property
    def bits(self) -> int:
        return 4 if self is DType.F4E2M1 else 8 * self.itemsize

    @property
    def numpy(self) -> np.dtype:
        found = _NUMPY.get(self)
        return found if found is not None else _ml_numpy()[self]

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
        # an array of an ml_dtypes type exists only once ml_dtypes is imported
        for d, npd in (_ml_numpy() if "ml_dtypes" in sys.modules else {}).items():
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
    DType.I32: np.dtype(np.int32),
    DType.U32: np.dtype(np.uint32),
    DType.I16: np.dtype(np.int16),
    DType.U16: np.dtype(np.uint16),
    DType.I8: np.dtype(np.int8),
    DType.U8: np.dtype(np.uint8),
}

#: the DTypes numpy holds through ml_dtypes: their type names there, and their item sizes
_ML_NAMES = {DType.BF16: "bfloat16", DType.F8E4M3: "float8_e4m3fn",
             DType.F8E5M2: "float8_e5m2", DType.F8E8M0: "float8_e8m0fnu",
             DType.F4E2M1: "float4_e2m1fn"}
_ML_ITEMSIZE = {DType.BF16: 2, DType.F8E4M3: 1, DType.F8E5M2: 1, DType.F8E8M0: 1,
                DType.F4E2M1: 1}


def _ml_numpy() -> dict[DType, np.dtype]:
    """The numpy dtypes of the ml_dtypes DTypes (imports ml_dtypes on first use)."""
    if _ML_NUMPY:
        return _ML_NUMPY
    import ml_dtypes

    _ML_NUMPY.update({d: np.dtype(getattr(ml_dtypes, name)) for d, name in _ML_NAMES.items()})
    return _ML_NUMPY


_ML_NUMPY: dict[DType, np.dtype] = {}

F32, F16, BF16 = DType.F32, DType.F16, DType.BF16
F8E4M3, F8E5M2, F8E8M0, F4E2M1 = DType.F8E4M3, DType.F8E5M2, DType.F8E8M0, DType.F4E2M1
I32, U32, I16, U16, I8, U8 = DType.I32, DType.U32, DType.I16, DType.U16, DType.I8, DType.U8
