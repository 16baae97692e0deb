"""Packed weights in traced code: the sources are Const binders, decoded by PackedDequant."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from poot.formats import PackedWeight
from poot.ops.core import const, packed_dequant, slice_axis
from poot.tracer import Tensor


@dataclass(frozen=True)
class PackedTensor:
    """A packed weight of logical shape [N, K]: its descriptor and its source binders."""

    weight: PackedWeight
    sources: tuple[Tensor, ...]

    @property
    def shape(self) -> tuple[int, int]:
        return self.weight.shape

    def dequant(self) -> Tensor:
        return packed_dequant(self.weight, self.sources)

    def rows(self, start: int, end: int) -> PackedTensor:
        """Output rows start..end of this weight: every source that holds rows sliced on
        its leading axis (one contiguous range of its bytes, which the planner makes a
        view), a source that does not depend on rows as it is."""
        held = self.weight.source_rows()
        return PackedTensor(self.weight.with_rows(end - start), tuple(
            slice_axis(s, 0, start, end) if r else s
            for s, r in zip(self.sources, held, strict=True)))


def packed_const(weight: PackedWeight, names: Sequence) -> PackedTensor:
    """Declare the sources of a packed weight as Consts (names or WeightRefs, role order)."""
    specs = weight.sources()
    if len(names) != len(specs):
        from poot.errors import FormatError

        raise FormatError(f"{weight.format} has {len(specs)} sources, got {len(names)} names")
    return PackedTensor(weight, tuple(const(s.type.shape, s.type.dtype, n)
                                      for s, n in zip(specs, names)))
