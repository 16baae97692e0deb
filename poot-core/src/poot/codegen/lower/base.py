"""The registry of lowerings and the planned-eqn signature they read."""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from poot.codegen import index as ix
from poot.codegen.builder import ArrayRef, KernelBuilder
from poot.codegen.expr import Const, Expr, Load
from poot.codegen.lower.schedule import DotSchedule, dot_schedule
from poot.codegen.program import OUT, Access, KernelProgram
from poot.codegen.target import FEATURES
from poot.digest import hexdigest
from poot.dtypes import DType
from poot.errors import LimitExceeded, UnsupportedOp
from poot.ir.graph import Lit
from poot.ir.ops import OpKind, Reshape
from poot.ir.types import TensorType

MAX_INDEX = 2**31 - 1      # kernel index arithmetic is I32
LOWERINGS: dict[type, Callable[[Sig], KernelProgram]] = {}
#: op classes whose lowerings read the contraction schedule (`Sig.dot_schedule`)
SCHEDULED: set[type] = set()


def lowers(*op_types: type, scheduled: bool = False):
    """Register a lowering for these op classes; `scheduled`: it reads the contraction
    schedule, so it lowers under the one `lower` is given (else its target's default)."""
    def deco(fn):
        for t in op_types:
            LOWERINGS[t] = fn
            if scheduled:
                SCHEDULED.add(t)
        return fn
    return deco


@dataclass(frozen=True)
class Sig:
    """One planned eqn: its op, operands (TensorType, or Lit for literals) and output;
    `features` are the optional statement families its target prints
    (poot.codegen.target.FEATURES), which open faster schedules; `schedule` the
    contraction schedules' tuning where it is not the target's default (None)."""

    op: OpKind
    ins: tuple[TensorType | Lit, ...]
    out: TensorType
    features: frozenset = frozenset()
    schedule: DotSchedule | None = None

    @property
    def dot_schedule(self) -> DotSchedule:
        """The tuning the contraction schedules follow (poot.codegen.lower.schedule)."""
        return self.schedule or dot_schedule(self.features)

    @property
    def name(self) -> str:
        """A kernel name unique to op, parameters and types (a valid identifier)."""
        key = repr((self.op, self.ins, self.out))
        if self.features:
            key += repr(sorted(self.features))
        if self.schedule is not None:
            key += repr(self.schedule)
        if hasattr(self.op, "body"):
            key += str(self.op.body)
        digest = hexdigest(key, size=5)
        return f"poot_{self.op.name.lower()}_{digest}"

    def type(self, i: int) -> TensorType:
        x = self.ins[i]
        return x.type if isinstance(x, Lit) else x

    def tensor_indices(self) -> list[int]:
        return [i for i, x in enumerate(self.ins) if not isinstance(x, Lit)]

    def builder(self, grid, workgroup, suffix: str = "") -> KernelBuilder:
        return KernelBuilder(self.name + suffix, grid, workgroup)

    def declare_input(self, kb: KernelBuilder, i: int, dtype=None, count=None) -> ArrayRef:
        t = self.type(i)
        return kb.buffer(f"in{i}", dtype or t.dtype, Access.READ,
                         t.size if count is None else count, operand=i)

    def declare_inputs(self, kb: KernelBuilder, views: dict | None = None) -> None:
        """Every tensor operand; `views` maps an operand index to the (dtype, count) its
        buffer is read as (e.g. 16-bit weights as U32 words)."""
        views = views or {}
        for i in self.tensor_indices():
            self.declare_input(kb, i, *views.get(i, (None, None)))

    def declare_all(self, kb: KernelBuilder, views: dict | None = None) -> None:
        """Every tensor operand, then the output."""
        self.declare_inputs(kb, views)
        self.declare_out(kb)

    def declare_out(self, kb: KernelBuilder, access: Access = Access.WRITE) -> ArrayRef:
        return kb.buffer("out", self.out.dtype, access, self.out.size, operand=OUT)

    def operand_at(self, i: int, coords: Sequence[Expr]) -> Expr:
        """Operand i at output coordinates (numpy broadcasting), or its literal."""
        x = self.ins[i]
        if isinstance(x, Lit):
            return Const(x.value, x.dtype)
        idx = ix.ravel(ix.broadcast_coords(coords, x.shape), x.shape)
        return Load(f"in{i}", idx, x.dtype)


def words(t: TensorType) -> tuple:
    """The (dtype, count) of an operand read as whole U32 words."""
    return (DType.U32, -(-t.nbytes // 4))


def lower(op: OpKind, ins: Sequence[TensorType | Lit], out: TensorType,
          features: frozenset = frozenset(), schedule: DotSchedule | None = None
          ) -> KernelProgram:
    """Lower one planned eqn to kernel programs (an UnsupportedOp names what has none)
    for a target that prints `features` besides the core statements, its contractions
    tuned by `schedule` (None: the target's default, `schedule.dot_schedule(features)`;
    ops whose lowerings read none are lowered, and named, as under the default)."""
    unknown = set(features) - FEATURES
    if unknown:
        raise UnsupportedOp(f"unknown kernel features {sorted(unknown)}", op=op.name)
    features = frozenset(features)
    if schedule == dot_schedule(features) or type(op) not in SCHEDULED:
        schedule = None             # named as the default's kernels are
    sig = Sig(op, tuple(ins), out, features, schedule)
    if isinstance(op, Reshape):
        return KernelProgram((), alias=0)
    fn = LOWERINGS.get(type(op))
    if fn is None:
        raise UnsupportedOp(f"no kernel lowering for {op.name}", op=op.name)
    lowering = fn(sig)
    for k in lowering.kernels:
        for b in k.buffers:
            if b.count > MAX_INDEX:
                raise LimitExceeded(f"{op.name}: buffer {b.name} holds {b.count} elements; "
                                    f"kernel indices are 32-bit (at most {MAX_INDEX})",
                                    op=op.name, dtype=str(b.dtype))
    return lowering
