"""The tracer: run Python model code on Tensors and record a Graph.

    g = poot.trace(lambda x, w: poot.ops.rms_norm(x, w, 1e-5),
                   poot.spec((4, 64), "f32", name="x"), poot.spec((64,), "f32", name="w"))

Inside a traced function, `poot.ops` records primitive eqns into the current
Builder. Specs declare the function's inputs: consts by default, or slots and
state (`kind="slot"`, `kind="state"`). A function returns its result Tensor;
it records witnesses, exports and state updates through `poot.ops`.
"""
from __future__ import annotations

import contextvars
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from poot.dtypes import DType
from poot.errors import TraceError
from poot.ir import ops as O
from poot.ir.builder import Builder, Ref
from poot.ir.graph import Graph, Lit
from poot.ir.types import SlotKind, TensorType, WeightRef

_current: contextvars.ContextVar[Builder | None] = contextvars.ContextVar("poot_trace",
                                                                          default=None)


class Tensor:
    """A traced value: a Ref of the current builder with numpy-style operators."""

    __slots__ = ("ref",)
    __array_priority__ = 1000  # numpy scalars defer to our operators

    def __init__(self, ref: Ref):
        self.ref = ref

    @property
    def shape(self) -> tuple[int, ...]:
        return self.ref.type.shape

    @property
    def dtype(self) -> DType:
        return self.ref.type.dtype

    @property
    def type(self) -> TensorType:
        return self.ref.type

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def __repr__(self):
        return f"Tensor({self.ref!r})"

    # operators record the same eqns as poot.ops (which builds on the helpers below)
    def __add__(self, o):
        return binary(O.BinaryOp.Add, self, o)

    def __radd__(self, o):
        return binary(O.BinaryOp.Add, o, self)

    def __sub__(self, o):
        return binary(O.BinaryOp.Sub, self, o)

    def __rsub__(self, o):
        return binary(O.BinaryOp.Sub, o, self)

    def __mul__(self, o):
        return binary(O.BinaryOp.Mul, self, o)

    def __rmul__(self, o):
        return binary(O.BinaryOp.Mul, o, self)

    def __truediv__(self, o):
        return binary(O.BinaryOp.Div, self, o)

    def __rtruediv__(self, o):
        return binary(O.BinaryOp.Div, o, self)

    def __neg__(self):
        return emit(O.Unary(O.UnaryOp.Neg), self.ref)

    def __matmul__(self, o):
        return emit(O.MatMul(), self.ref, o.ref)

    def reshape(self, *shape):
        one = len(shape) == 1 and isinstance(shape[0], (tuple, list))
        return reshape(self, shape[0] if one else shape)

    def astype(self, dtype):
        return cast(self, dtype)


# -- recording eqns (poot.ops builds its wrappers on these) --------------------------------
def emit(op: O.OpKind, *xs) -> Tensor:
    """Record one eqn in the current trace."""
    return Tensor(builder().eqn(op, *xs))


def dtype_of(*xs) -> DType | None:
    return next((x.dtype for x in xs if isinstance(x, Tensor)), None)


def binary(op: O.BinaryOp, a, b) -> Tensor:
    """A Binary eqn; a Python scalar operand takes the other operand's dtype."""
    like = dtype_of(a, b)
    return emit(O.Binary(op), as_operand(a, like), as_operand(b, like))


def cast(x: Tensor, dtype) -> Tensor:
    dtype = DType.parse(dtype)
    return x if x.dtype is dtype else emit(O.Cast(dtype), x.ref)


def reshape(x: Tensor, shape: Sequence[int]) -> Tensor:
    shape = tuple(int(d) for d in shape)
    if -1 in shape:
        known = -1 * math.prod(shape)
        shape = tuple(x.type.size // known if d == -1 else d for d in shape)
    return x if x.shape == shape else emit(O.Reshape(shape), x.ref)


@dataclass(frozen=True)
class Spec:
    """A traced input: its type and how it is bound."""

    shape: tuple[int, ...]
    dtype: DType
    name: str | None = None
    kind: str = "const"                 # const | slot | state
    slot: SlotKind | None = None        # for kind="slot"
    bound: int | None = None            # exclusive upper bound of slot values
    weight: WeightRef | None = None     # identity of a mapped weight


def spec(shape: Sequence[int], dtype: DType | str = DType.F32, *, name: str | None = None,
         kind: str = "const", slot: SlotKind | str | None = None, bound: int | None = None,
         weight: WeightRef | None = None) -> Spec:
    if kind not in ("const", "slot", "state"):
        raise TraceError(f"unknown spec kind {kind!r}: use const, slot or state")
    if isinstance(slot, str):
        slot = SlotKind.get(slot)
    if kind == "slot" and slot is None:
        raise TraceError("a slot spec needs slot=<SlotKind> (Token, Pos, SlotMap, WriteMap, ...)")
    return Spec(tuple(int(d) for d in shape), DType.parse(dtype), name, kind, slot, bound, weight)


def builder() -> Builder:
    b = _current.get()
    if b is None:
        raise TraceError("no trace in progress: call poot.ops inside poot.trace(fn, ...)")
    return b


def bind(s: Spec, index: int = 0) -> Tensor:
    """Declare an input of the current trace from a Spec."""
    b = builder()
    name = s.name or f"in{index}"
    if s.kind == "slot":
        dtype_ok = s.dtype is s.slot.dtype
        if not dtype_ok:
            raise TraceError(f"slot {name}: kind {s.slot.label} holds {s.slot.dtype}, "
                             f"not {s.dtype}")
        return Tensor(b.slot(s.slot, s.shape, name, s.bound))
    t = TensorType(s.shape, s.dtype)
    if s.kind == "state":
        return Tensor(b.state(t, name))
    return Tensor(b.const(t, s.weight or name))


def trace(fn: Callable[..., Tensor], *specs: Spec, name: str | None = None) -> Graph:
    """Run `fn` on Tensors for `specs` and return the recorded, checked Graph."""
    b = Builder(name or getattr(fn, "__name__", "graph"))
    token = _current.set(b)
    try:
        args = [bind(s, i) for i, s in enumerate(specs)]
        out = fn(*args)
        if not isinstance(out, Tensor):
            raise TraceError(f"traced function must return a Tensor, got {type(out).__name__}")
        b.result(out.ref)
    finally:
        _current.reset(token)
    return b.finish()


def as_operand(x, like: DType | None) -> Ref | Lit:
    """A Tensor's Ref, or a Python scalar as a Lit of the dtype `like`."""
    if isinstance(x, Tensor):
        return x.ref
    if isinstance(x, (int, float)) or hasattr(x, "dtype") and getattr(x, "shape", None) == ():
        if like is None:
            raise TraceError("a scalar operand needs a tensor operand to take its dtype from")
        return Lit(x, like)  # Lit refuses a non-integral value for an integer dtype
    raise TraceError(f"cannot trace operand of type {type(x).__name__}")


__all__ = ["Tensor", "Spec", "spec", "trace", "builder", "bind", "as_operand"]
