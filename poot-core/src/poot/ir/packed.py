"""The IR's descriptor of a packed weight, and the format registry it is resolved through.

A PackedDequant (and each packed contraction compile forms from it) carries a
`PackedWeight`: a format name, the logical [N, K] shape and the format's parameters. What a
format is (its sources, its numpy decode, its scalar decode program) belongs to the format
plugins and to poot.formats, above the IR: the IR never imports them. The registry that
turns a name into a format is installed here from above (`use_formats`); poot.formats
installs the plugins' registry when it is imported, and every module that makes packed
weights (the format plugins, poot.ops, the model loaders) imports it.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from poot.errors import FormatError

if TYPE_CHECKING:  # pragma: no cover
    from poot.formats import WeightFormat
    from poot.ir.types import TensorType

#: name -> format, the registry installed by `use_formats` (None: none installed yet)
_lookup: Callable[[str], WeightFormat] | None = None


def use_formats(lookup: Callable[[str], WeightFormat]) -> None:
    """Install the registry every PackedWeight resolves its format through: `lookup(name)`
    returns the format or raises FormatError."""
    global _lookup
    _lookup = lookup


def format_named(name: str) -> WeightFormat:
    """The registered format `name`, through the installed registry."""
    if _lookup is None:
        raise FormatError(f"packed weight format {name!r}: no format registry is installed "
                          f"(importing poot.formats installs the plugins' registry)")
    return _lookup(name)


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
        return format_named(self.format)

    def sources(self) -> list[SourceSpec]:
        return list(self.get_format().roles(self.shape, self.attr_dict))

    def dequantize(self, sources: Sequence[np.ndarray]) -> np.ndarray:
        return self.get_format().dequantize(list(sources), self.shape, **self.attr_dict)

    def source_rows(self) -> list[bool]:
        """Per source: True where its leading axis is the weight's output rows (GGUF
        blocks lie within rows, so rows of the weight are rows of the source), False where
        it does not depend on the rows (a per-tensor scale). The format's sources for twice
        the rows tell which. A source that packs rows otherwise (GPTQ/AWQ pack output
        columns into words) raises FormatError: its rows cannot be taken apart."""
        n, k = self.shape
        fmt, attrs = self.get_format(), self.attr_dict
        rows = []
        for a, b in zip(fmt.roles((n, k), attrs), fmt.roles((2 * n, k), attrs), strict=True):
            sa, sb = a.type.shape, b.type.shape
            if sa != sb and not (sa[:1] == (n,) and sb == (2 * n,) + sa[1:]):
                raise FormatError(f"{self}: source {a.role!r} does not hold one row per "
                                  f"output row")
            rows.append(sa != sb)
        return rows

    def with_rows(self, n: int) -> PackedWeight:
        """The descriptor of `n` output rows of this format and K (a row range or a stack
        of such weights)."""
        return PackedWeight(self.format, (n, self.shape[1]), self.attrs)

    def __repr__(self):
        a = ",".join(f"{k}={v}" for k, v in self.attrs)
        return f"{self.format}[{self.shape[0]}x{self.shape[1]}{';' + a if a else ''}]"

    def __str__(self):
        """The IR text form (`poot.ir.parse` reads it back): attribute values as literals."""
        a = ",".join(f"{k}={v!r}" for k, v in self.attrs)
        return f"{self.format}[{self.shape[0]}x{self.shape[1]}{';' + a if a else ''}]"


__all__ = ["PackedWeight", "SourceSpec", "format_named", "use_formats"]
