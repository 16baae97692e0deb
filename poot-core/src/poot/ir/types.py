"""The value-level types of the IR: ids, tensor types, storage classes, identities.

ValueId is its own type: every API that takes one refuses a bare int with a
TypeError, which is Python's form of "a bare usize is rejected by the compiler".
"""
from __future__ import annotations

import dataclasses
import enum
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Generic, TypeVar

from poot.dtypes import DType
from poot.errors import ShapeError

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class ValueId:
    """The id of one value of one graph. Not an int and not interchangeable with one."""

    index: int

    def __post_init__(self):
        if type(self.index) is not int or not 0 <= self.index < 2 ** 32:
            raise TypeError(f"ValueId wraps a u32 (an int in [0, 2**32)), got {self.index!r}")

    def __repr__(self) -> str:
        return f"%{self.index}"

    def __index__(self):  # pragma: no cover - guard: ValueIds are not integers
        raise TypeError("a ValueId is not an integer index")


def require_value_id(v: object, what: str = "value") -> ValueId:
    if not isinstance(v, ValueId):
        raise TypeError(f"{what} must be a ValueId, not {type(v).__name__} ({v!r})")
    return v


class ValueTable(Generic[T]):
    """A dense table indexed by ValueId only."""

    __slots__ = ("_rows",)

    def __init__(self, rows: list[T] | None = None):
        self._rows: list[T] = list(rows or [])

    def __getitem__(self, vid: ValueId) -> T:
        require_value_id(vid)
        if vid.index >= len(self._rows):
            raise KeyError(f"{vid!r} is not a value of this graph")
        return self._rows[vid.index]

    def __setitem__(self, vid: ValueId, row: T) -> None:
        require_value_id(vid)
        self._rows[vid.index] = row

    def __contains__(self, vid: object) -> bool:
        return isinstance(vid, ValueId) and vid.index < len(self._rows)

    def append(self, row: T) -> ValueId:
        self._rows.append(row)
        return ValueId(len(self._rows) - 1)

    def __len__(self) -> int:
        return len(self._rows)

    def ids(self) -> Iterator[ValueId]:
        return (ValueId(i) for i in range(len(self._rows)))

    def items(self) -> Iterator[tuple[ValueId, T]]:
        return ((ValueId(i), r) for i, r in enumerate(self._rows))

    def copy(self) -> ValueTable[T]:
        return ValueTable(self._rows)


@dataclass(frozen=True, slots=True)
class TensorType:
    """Shape and dtype of a tensor; no data."""

    shape: tuple[int, ...]
    dtype: DType

    def __post_init__(self):
        shape = tuple(self.shape)
        if not all(type(d) is int or hasattr(d, "__index__") for d in shape):
            raise ShapeError(f"shape {self.shape!r} must hold integers")
        shape = tuple(int(d) for d in shape)
        if any(d < 0 for d in shape):
            raise ShapeError(f"shape {shape} has a negative dimension")
        object.__setattr__(self, "shape", shape)
        object.__setattr__(self, "dtype", DType.parse(self.dtype))

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return (self.size * self.dtype.bits + 7) // 8

    def with_shape(self, shape) -> TensorType:
        return TensorType(tuple(shape), self.dtype)

    def with_dtype(self, dtype: DType) -> TensorType:
        return TensorType(self.shape, dtype)

    def __repr__(self) -> str:
        return f"{self.dtype}[{','.join(map(str, self.shape))}]"

    __str__ = __repr__


# -- storage classes -------------------------------------------------------------
class SlotKind:
    """What a Slot carries, and the range of values it may hold.

    The four kinds the IR knows are below. An owner (a pass, a runtime feature,
    a plugin) declares further roles with `SlotKind.declare(label, dtype, lo, hi)`;
    the IR knows only the label and its one type rule (dtype and value range).
    `hi=None` means "bounded by the graph": the bind checks it against `bound`,
    a per-slot limit stated where the slot is declared (e.g. KV capacity).
    """

    __slots__ = ("label", "dtype", "lo", "hi", "owner", "allows_negative_one")
    _registry: dict[str, SlotKind] = {}

    def __init__(self, label: str, dtype: DType, lo: int | None, hi: int | None,
                 owner: str = "poot.ir", allows_negative_one: bool = False):
        self.label, self.dtype, self.lo, self.hi = label, DType.parse(dtype), lo, hi
        self.owner, self.allows_negative_one = owner, allows_negative_one

    @classmethod
    def declare(cls, label: str, dtype: DType, lo: int | None = None, hi: int | None = None,
                owner: str = "plugin", allows_negative_one: bool = False) -> SlotKind:
        """Declare (or fetch the identical) owner-defined slot role."""
        kind = cls(label, dtype, lo, hi, owner, allows_negative_one)
        old = cls._registry.get(label)
        if old is not None:
            if (old.dtype, old.lo, old.hi, old.allows_negative_one) != (
                    kind.dtype, kind.lo, kind.hi, kind.allows_negative_one):
                from poot.errors import IRError

                raise IRError(f"slot role {label!r} already declared by {old.owner} with "
                              f"another type rule")
            return old
        cls._registry[label] = kind
        return kind

    @classmethod
    def get(cls, label: str) -> SlotKind:
        try:
            return cls._registry[label]
        except KeyError:
            from poot.errors import IRError

            raise IRError(f"unknown slot kind {label!r}; declared: "
                          f"{', '.join(sorted(cls._registry))}") from None

    def require_declared(self) -> None:
        """Refuse a role no owner declared (built directly rather than through `declare`,
        or declared elsewhere with another rule): an IRError naming it."""
        if SlotKind._registry.get(self.label) is not self:
            from poot.errors import IRError

            raise IRError(f"slot role {self.label!r} ({self.dtype}) is not declared; its "
                          f"owner declares it with SlotKind.declare or the poot_slot_roles "
                          f"hook before a graph uses it")

    def __repr__(self) -> str:
        return self.label

    def __eq__(self, other):
        return isinstance(other, SlotKind) and other.label == self.label

    def __hash__(self):
        return hash(self.label)


# Token ids are bounded by the vocabulary, positions by the KV capacity, slot
# maps by the pool size: the declaring site gives that bound (Slot.bound).
SlotKind.TOKEN = SlotKind.declare("Token", DType.I32, 0, None, owner="poot.ir")
SlotKind.POS = SlotKind.declare("Pos", DType.I32, 0, None, owner="poot.ir")
SlotKind.SLOT_MAP = SlotKind.declare("SlotMap", DType.I32, 0, None, owner="poot.ir")
SlotKind.WRITE_MAP = SlotKind.declare("WriteMap", DType.I32, 0, None, owner="poot.ir",
                                      allows_negative_one=True)


@dataclass(frozen=True, slots=True)
class Slot:
    """A per-step input: its kind and the exclusive upper bound of its values."""

    kind: SlotKind
    bound: int | None = None

    def __repr__(self):
        return f"Slot({self.kind.label}{'' if self.bound is None else f' <{self.bound}'})"

    def valid_range(self) -> tuple[int | None, int | None]:
        hi = self.kind.hi if self.kind.hi is not None else self.bound
        return self.kind.lo, hi


class StorageClass(enum.Enum):
    DEVICE = "Device"
    CONST = "Const"
    SLOT = "Slot"
    STATE = "State"
    COMPUTED = "Computed"


@dataclass(frozen=True, slots=True)
class Storage:
    """Device | Const | Slot(Slot) | State | Computed."""

    cls: StorageClass
    slot: Slot | None = None

    def __repr__(self):
        return repr(self.slot) if self.cls is StorageClass.SLOT else self.cls.value

    @property
    def is_input(self) -> bool:
        return self.cls in (StorageClass.CONST, StorageClass.SLOT, StorageClass.STATE)


Storage.DEVICE = Storage(StorageClass.DEVICE)
Storage.CONST = Storage(StorageClass.CONST)
Storage.STATE = Storage(StorageClass.STATE)
Storage.COMPUTED = Storage(StorageClass.COMPUTED)


@dataclass(frozen=True, slots=True)
class WeightRef:
    """Where a mapped weight comes from: checkpoint, tensor name and payload identity.

    `payload` is a content key (hash or file+offset+length+mtime) so that two
    binders of the same bytes share one cached upload and different bytes never do.
    `format` names the storage representation (a dtype or a packed format name).
    """

    checkpoint: str
    tensor: str
    payload: str = ""
    format: str = ""

    def __repr__(self):
        return f"{self.tensor}@{self.checkpoint}"


@dataclass(frozen=True, slots=True)
class SlotKey:
    """The identity of a slot binder: its kind and a name unique within the graph."""

    kind: SlotKind
    name: str


@dataclass(frozen=True, slots=True)
class BoundaryId:
    """Names an Export output: a value handed to another stage (pipeline cut)."""

    name: str


@dataclass(frozen=True, slots=True)
class Identity:
    """Anonymous | Named(str) | Weight(WeightRef) | Slot(SlotKey)."""

    kind: str = "Anonymous"
    name: str | None = None
    weight: WeightRef | None = None
    slot: SlotKey | None = None

    @staticmethod
    def named(name: str) -> Identity:
        return Identity("Named", name=name)

    @staticmethod
    def of_weight(ref: WeightRef) -> Identity:
        return Identity("Weight", weight=ref)

    @staticmethod
    def of_slot(key: SlotKey) -> Identity:
        return Identity("Slot", slot=key)

    @property
    def label(self) -> str | None:
        if self.kind == "Named":
            return self.name
        if self.kind == "Weight":
            return self.weight.tensor
        if self.kind == "Slot":
            return self.slot.name
        return None


Identity.ANONYMOUS = Identity()


@dataclass(frozen=True, slots=True)
class ValueMeta:
    aval: TensorType
    storage: Storage = Storage.DEVICE
    identity: Identity = Identity.ANONYMOUS

    def replace(self, **kw) -> ValueMeta:
        return dataclasses.replace(self, **kw)
