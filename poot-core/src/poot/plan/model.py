"""What a Plan is made of: regions of memory, places in them, and the steps that run.

Everything here is plain data computed on the host before the first dispatch; a
backend's runtime reads it in `Runtime.load` and never changes it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from poot.ir.graph import Eqn, Lit
from poot.ir.ops.base import OpKind
from poot.ir.types import TensorType, ValueId, WeightRef

if TYPE_CHECKING:  # pragma: no cover
    from poot.backend import Backend, Device, Lowering
    from poot.ir.graph import Graph

ALIGN = 256
ARENA = "arena"


def align(n: int, to: int = ALIGN) -> int:
    return (n + to - 1) // to * to


@dataclass(frozen=True)
class Region:
    """One buffer the executor allocates: "arena", "weight", "slot" or "state".

    `value` is the binder a slot or state region holds; `weight` the WeightSpec a weight
    region holds.
    """

    name: str
    kind: str
    nbytes: int
    value: ValueId | None = None
    weight: WeightSpec | None = None


@dataclass(frozen=True)
class Place:
    """Where one tensor lives: `region` at byte `offset`, of `type`.

    `strides` (in elements) is None for a C-contiguous tensor, else the strides of a
    view into its region (a Transpose planned as a strided view).
    """

    region: str
    offset: int
    type: TensorType
    strides: tuple[int, ...] | None = None

    @property
    def nbytes(self) -> int:
        return self.type.nbytes

    @property
    def contiguous(self) -> bool:
        return self.strides is None

    def __str__(self) -> str:
        where = f"{self.region}+{self.offset}" if self.region == ARENA else self.region
        view = f" strides={self.strides}" if self.strides else ""
        return f"{self.type}@{where}{view}"


@dataclass(frozen=True, eq=False)
class WeightSpec:
    """A tensor bound once and cached: a const binder, or a value folded at bind time.

    A raw const has `binder` set (and `ref`, its WeightRef, when the graph names one).
    A folded value has `op` and `operands` (WeightSpecs or Lits) and is computed once on
    the host by the oracle. `representation` names its storage representation in the
    weight cache key ("f32-decoded" for a decoded packed weight, "folded" otherwise).
    """

    type: TensorType
    binder: ValueId | None = None
    ref: WeightRef | None = None
    op: OpKind | None = None
    operands: tuple[WeightSpec | Lit, ...] = ()
    representation: str = ""

    @property
    def folded(self) -> bool:
        return self.binder is None


@dataclass(frozen=True, eq=False)
class Step:
    """One planned eqn that dispatches work.

    `inputs` holds a Place per Value operand and the Lit itself per literal, in operand
    order; `out` is where the result goes. `inplace` marks a DynamicUpdateSlice or
    ScatterUpdate whose `out` is the donated state buffer its first operand already
    occupies: only the update is written. `lowering` is the backend's choice (kernel,
    launch shape, program).
    """

    index: int
    eqn: Eqn
    lowering: Lowering
    inputs: tuple[Place | Lit, ...]
    out: Place
    inplace: bool = False


@dataclass(frozen=True)
class Copy:
    """An end-of-step copy: a state_out value that could not be updated in place."""

    src: Place
    dst: Place


@dataclass(frozen=True)
class Note:
    """A planned eqn that dispatches nothing: an alias (Reshape), a strided view
    (Transpose) or a value folded at bind time. Kept for printing."""

    index: int
    eqn: Eqn
    kind: str            # "alias", "view" or "bind"
    out: Place


@dataclass
class Plan:
    """A graph laid out for one backend device: kernels in order and every buffer placed."""

    graph: Graph
    backend: Backend
    device: Device
    steps: list[Step]
    copies: list[Copy]
    notes: list[Note]
    regions: dict[str, Region]
    places: dict[ValueId, Place]
    outputs: list[tuple[Any, Place]]          # (GraphOutput, Place) for non-state outputs
    state: list[tuple[ValueId, ValueId, str]]  # (state_in, state_out, region name)
    #: sum of the sizes of every Device value that got its own buffer, unshared
    unshared_bytes: int = 0
    intervals: dict[ValueId, tuple[int, int]] = field(default_factory=dict)

    @property
    def arena_size(self) -> int:
        return self.regions[ARENA].nbytes

    @property
    def dispatches(self) -> int:
        return sum(s.lowering.dispatches for s in self.steps) + len(self.copies)

    def weight_regions(self) -> list[Region]:
        return [r for r in self.regions.values() if r.kind == "weight"]

    def slot_regions(self) -> list[Region]:
        return [r for r in self.regions.values() if r.kind == "slot"]

    def state_regions(self) -> list[Region]:
        return [r for r in self.regions.values() if r.kind == "state"]

    def __str__(self) -> str:
        from poot.plan.show import format_plan

        return format_plan(self)

    def summary(self) -> str:
        from poot.plan.show import format_summary

        return format_summary(self)


def elements(shape: tuple[int, ...]) -> int:
    return math.prod(shape)


__all__ = ["ALIGN", "ARENA", "Region", "Place", "WeightSpec", "Step", "Copy", "Note", "Plan",
           "align"]
