"""The packed-weight seam between the IR and the format plugins (poot_quant and others).

The IR carries a `PackedWeight` descriptor on each PackedDequant (and on the
packed contractions compile forms from it). The descriptor names a format; the
format itself (its numpy decode, its scalar decode program, its quantizer) is
registered by a plugin through the `poot_weight_formats` hook. poot-core never
imports a format package.

A format is any object with this shape (duck-typed; see `WeightFormat`):

    name: str                                    e.g. "gguf:Q4_K", "gptq:int4"
    roles(shape, attrs) -> list[SourceSpec]      the packed sources, in order
    dequantize(sources, shape, **attrs) -> f32   numpy reference decode [N, K]
    decode_expr(load, n, k, shape, attrs) -> Expr
        the value of W[n, k] as a scalar program (poot.codegen.expr). `load(role,
        word_index)` returns the 32-bit word (U32) at that index of the source
        buffer `role`, whose bytes are viewed as little-endian u32 words (sources
        are padded to a multiple of 4 bytes). Decode programs load only words.
    quantize(w, **attrs) -> list[np.ndarray]     optional, where the format defines one
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from poot.dtypes import DType
from poot.errors import FormatError

if TYPE_CHECKING:  # pragma: no cover - the IR imports this module; no cycle at run time
    from poot.ir.types import TensorType


@dataclass(frozen=True)
class SourceSpec:
    """One packed source of a weight: its role name and its tensor type."""

    role: str
    type: TensorType


@dataclass(frozen=True)
class PackedWeight:
    """The IR's descriptor of a packed weight: format, logical [N, K] shape, parameters.

    `attrs` holds format parameters as sorted (key, value) pairs (group size,
    symmetric, act-order, block shape, ...), so descriptors hash and compare.
    """

    format: str
    shape: tuple[int, int]
    attrs: tuple[tuple[str, Any], ...] = field(default=())

    def __post_init__(self):
        object.__setattr__(self, "shape", tuple(int(d) for d in self.shape))
        attrs = self.attrs.items() if isinstance(self.attrs, dict) else self.attrs
        object.__setattr__(self, "attrs", tuple(sorted((str(k), v) for k, v in attrs)))
        if len(self.shape) != 2:
            raise FormatError(f"packed weight {self.format}: logical shape must be [N, K], "
                              f"got {self.shape}")

    @property
    def attr_dict(self) -> dict[str, Any]:
        return dict(self.attrs)

    def get_format(self) -> WeightFormat:
        return get_format(self.format)

    def sources(self) -> list[SourceSpec]:
        return list(self.get_format().roles(self.shape, self.attr_dict))

    def dequantize(self, sources: Sequence[np.ndarray]) -> np.ndarray:
        return self.get_format().dequantize(list(sources), self.shape, **self.attr_dict)

    def __repr__(self):
        a = ",".join(f"{k}={v}" for k, v in self.attrs)
        return f"{self.format}[{self.shape[0]}x{self.shape[1]}{';' + a if a else ''}]"


class WeightFormat(Protocol):
    name: str

    def roles(self, shape: tuple[int, int], attrs: dict) -> Sequence[SourceSpec]: ...

    def dequantize(self, sources: Sequence[np.ndarray], shape: tuple[int, int],
                   **attrs) -> np.ndarray: ...

    def decode_expr(self, load: Callable, n, k, shape: tuple[int, int], attrs: dict): ...


def formats() -> dict[str, WeightFormat]:
    """Every format registered through the plugin seam, by name."""
    from poot.plugin import manager

    return manager().formats()


def get_format(name: str) -> WeightFormat:
    table = formats()
    try:
        return table[name]
    except KeyError:
        known = ", ".join(sorted(table)) or "none (is poot-quant installed?)"
        raise FormatError(f"unknown packed weight format {name!r}; registered: {known}") \
            from None


def words_of(source: np.ndarray) -> np.ndarray:
    """A source's bytes as little-endian u32 words, zero-padded to a whole word."""
    raw = np.ascontiguousarray(source).reshape(-1).view(np.uint8)
    pad = (-raw.size) % 4
    if pad:
        raw = np.concatenate([raw, np.zeros(pad, np.uint8)])
    return raw.view("<u4")


__all__ = ["PackedWeight", "SourceSpec", "WeightFormat", "formats", "get_format", "words_of",
           "DType"]
