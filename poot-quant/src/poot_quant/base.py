"""What every format shares: checking sources against its roles, and naming failures."""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from poot.dtypes import DType
from poot.errors import FormatError
from poot.formats import SourceSpec
from poot.ir.types import TensorType

from poot_quant.exprs import check_addressable


class Format:
    """Base of the poot_quant formats (the `poot.formats.WeightFormat` protocol).

    A subclass states `name`, `roles`, `decode` (numpy, sources already checked and
    reshaped to their role shapes) and `decode_expr`; `quantize` where defined.
    """

    name: str = ""
    #: the attributes this format reads; any other is refused (a typo must not pass silently)
    attr_names: frozenset[str] = frozenset()
    #: whether every decoded value is scale * integer (+ offset): the precision rewrite
    #: quantizes the activations of such a weight to int8 rows (docs/ir.md section 15)
    integer_codes: bool = False

    def __repr__(self) -> str:
        return f"<format {self.name}>"

    # -- the protocol -------------------------------------------------------------
    def roles(self, shape, attrs) -> list[SourceSpec]:
        raise NotImplementedError

    def dequantize(self, sources: Sequence[np.ndarray], shape, **attrs) -> np.ndarray:
        shape = self.check_shape(shape, attrs)
        arrays = self.check_sources(sources, shape, attrs)
        with np.errstate(over="ignore", invalid="ignore"):  # Inf/NaN scales are encodings
            out = self.decode(arrays, shape, attrs)
        assert out.shape == shape and out.dtype == np.float32, (self.name, out.shape)
        return out

    def decode(self, arrays: dict[str, np.ndarray], shape, attrs) -> np.ndarray:
        raise NotImplementedError

    def decode_expr(self, load, n, k, shape, attrs):
        raise NotImplementedError

    # -- checks -------------------------------------------------------------------
    def fail(self, message: str, cls=FormatError):
        raise cls(f"{self.name}: {message}")

    def check_shape(self, shape, attrs) -> tuple[int, int]:
        try:
            n, k = (int(d) for d in shape)
        except (TypeError, ValueError):
            self.fail(f"logical shape must be [N, K], got {shape!r}")
        if n <= 0 or k <= 0:
            self.fail(f"logical shape [{n}, {k}] must be positive")
        unknown = sorted(set(attrs) - self.attr_names)
        if unknown:
            known = ", ".join(sorted(self.attr_names)) or "none"
            self.fail(f"unknown attribute(s) {', '.join(unknown)} (this format reads: {known})")
        return n, k

    def check_sources(self, sources, shape, attrs) -> dict[str, np.ndarray]:
        """Each source as an array of its role's dtype and shape (a view, never a copy
        of a memory map). Refuses a wrong count, byte size or dtype."""
        specs = self.roles(shape, attrs)
        if len(sources) != len(specs):
            self.fail(f"expects {len(specs)} sources ({', '.join(s.role for s in specs)}) for "
                      f"shape {list(shape)}, got {len(sources)}")
        pairs = zip(specs, sources, strict=True)
        return {spec.role: self.check_source(spec, src) for spec, src in pairs}

    def check_source(self, spec: SourceSpec, src) -> np.ndarray:
        arr = np.asarray(src)
        want = spec.type.dtype.numpy
        raw_bytes = want.itemsize == 1 and arr.dtype.itemsize == 1
        if arr.dtype != want and not raw_bytes:
            self.fail(f"source {spec.role!r} has dtype {arr.dtype}, expected {spec.type.dtype}")
        if arr.size != spec.type.size:
            self.fail(f"source {spec.role!r} has {arr.size} elements (shape "
                      f"{list(arr.shape)}); expected shape {list(spec.type.shape)}")
        if not arr.flags.c_contiguous:
            arr = np.ascontiguousarray(arr)
        return arr.view(want).reshape(spec.type.shape)

    def check_expr_sources(self, shape, attrs) -> list[SourceSpec]:
        specs = self.roles(self.check_shape(shape, attrs), attrs)
        for s in specs:
            check_addressable(self.name, s.role, s.type.nbytes)
        return specs


def spec(role: str, shape: Sequence[int], dtype: DType) -> SourceSpec:
    return SourceSpec(role, TensorType(tuple(int(d) for d in shape), dtype))


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def f16_to_f32(raw_u8: np.ndarray) -> np.ndarray:
    """Little-endian f16 pairs of bytes (last axis of length 2) to f32, exactly."""
    return np.ascontiguousarray(raw_u8).view("<f2")[..., 0].astype(np.float32)
