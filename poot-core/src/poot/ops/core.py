"""Primitive wrappers: each call records one eqn of the IR's vocabulary."""
from __future__ import annotations

from collections.abc import Sequence

from poot.dtypes import DType
from poot.errors import TraceError
from poot.ir import ops as O
from poot.ir.types import SlotKind, TensorType, WeightRef
from poot.tracer import Tensor, as_operand, builder


def _emit(op, *xs) -> Tensor:
    return Tensor(builder().eqn(op, *xs))


def _dtype_of(*xs) -> DType | None:
    return next((x.dtype for x in xs if isinstance(x, Tensor)), None)


def _bin(op: O.BinaryOp, a, b) -> Tensor:
    like = _dtype_of(a, b)
    return _emit(O.Binary(op), as_operand(a, like), as_operand(b, like))


def add(a, b): return _bin(O.BinaryOp.Add, a, b)
def sub(a, b): return _bin(O.BinaryOp.Sub, a, b)
def mul(a, b): return _bin(O.BinaryOp.Mul, a, b)
def div(a, b): return _bin(O.BinaryOp.Div, a, b)
def maximum(a, b): return _bin(O.BinaryOp.Max, a, b)
def minimum(a, b): return _bin(O.BinaryOp.Min, a, b)
def ge(a, b): return _bin(O.BinaryOp.Ge, a, b)
def geu(a, b): return _bin(O.BinaryOp.GeU, a, b)
def bit_and(a, b): return _bin(O.BinaryOp.And, a, b)
def bit_or(a, b): return _bin(O.BinaryOp.Or, a, b)
def bit_xor(a, b): return _bin(O.BinaryOp.Xor, a, b)
def shl(a, b): return _bin(O.BinaryOp.Shl, a, b)
def shr(a, b): return _bin(O.BinaryOp.Shr, a, b)


def _un(op: O.UnaryOp, x: Tensor) -> Tensor:
    return _emit(O.Unary(op), x.ref)


def neg(x): return _un(O.UnaryOp.Neg, x)
def exp(x): return _un(O.UnaryOp.Exp, x)
def log(x): return _un(O.UnaryOp.Log, x)
def sqrt(x): return _un(O.UnaryOp.Sqrt, x)
def recip(x): return _un(O.UnaryOp.Recip, x)
def tanh(x): return _un(O.UnaryOp.Tanh, x)
def erf(x): return _un(O.UnaryOp.Erf, x)
def bit_not(x): return _un(O.UnaryOp.Not, x)
def clz(x): return _un(O.UnaryOp.Clz, x)


def select(cond: Tensor, if_true, if_false, dtype=None) -> Tensor:
    """Elementwise choice; `dtype` types the branches when both are Python scalars."""
    like = _dtype_of(if_true, if_false) or (DType.parse(dtype) if dtype else None)
    return _emit(O.Select(), cond.ref, as_operand(if_true, like), as_operand(if_false, like))


def cast(x: Tensor, dtype) -> Tensor:
    dtype = DType.parse(dtype)
    return x if x.dtype is dtype else _emit(O.Cast(dtype), x.ref)


def iota(shape: Sequence[int], axis: int = 0, dtype=DType.I32) -> Tensor:
    return _emit(O.Iota(tuple(shape), axis, DType.parse(dtype)))


def broadcast_to(x: Tensor, shape: Sequence[int]) -> Tensor:
    shape = tuple(shape)
    return x if x.shape == shape else _emit(O.Broadcast(shape), x.ref)


def reshape(x: Tensor, shape: Sequence[int]) -> Tensor:
    shape = tuple(int(d) for d in shape)
    if -1 in shape:
        known = -1 * int(__import__("math").prod(shape))
        shape = tuple(x.type.size // known if d == -1 else d for d in shape)
    return x if x.shape == shape else _emit(O.Reshape(shape), x.ref)


def transpose(x: Tensor, perm: Sequence[int]) -> Tensor:
    return _emit(O.Transpose(tuple(perm)), x.ref)


def swap_last(x: Tensor) -> Tensor:
    r = x.ndim
    return transpose(x, tuple(range(r - 2)) + (r - 1, r - 2))


def slice_axis(x: Tensor, axis: int, start: int, end: int) -> Tensor:
    return _emit(O.Slice(axis, start, end), x.ref)


def concat(xs: Sequence[Tensor], axis: int) -> Tensor:
    return _emit(O.Concat(axis), *(x.ref for x in xs))


def gather(src: Tensor, idx: Tensor, axis: int = 0) -> Tensor:
    return _emit(O.Gather(axis), src.ref, idx.ref)


def scatter_update(base: Tensor, src: Tensor, slots: Tensor) -> Tensor:
    return _emit(O.ScatterUpdate(), base.ref, src.ref, slots.ref)


def dynamic_update_slice(x: Tensor, update: Tensor, index: Tensor, axis: int = 0) -> Tensor:
    return _emit(O.DynamicUpdateSlice(axis), x.ref, update.ref, index.ref)


def argtopk(x: Tensor, k: int) -> Tensor:
    return _emit(O.ArgTopK(k), x.ref)


def reduce_sum(x: Tensor, axis: int = -1, keepdim: bool = False) -> Tensor:
    return _emit(O.Reduce(O.ReduceOp.Sum, axis, keepdim), x.ref)


def reduce_max(x: Tensor, axis: int = -1, keepdim: bool = False) -> Tensor:
    return _emit(O.Reduce(O.ReduceOp.Max, axis, keepdim), x.ref)


def matmul(a: Tensor, b: Tensor) -> Tensor:
    return _emit(O.MatMul(), a.ref, b.ref)


def indexed_matmul(x: Tensor, w: Tensor, idx: Tensor) -> Tensor:
    return _emit(O.IndexedMatMul(), x.ref, w.ref, idx.ref)


def packed_dequant(weight, sources: Sequence[Tensor]) -> Tensor:
    return _emit(O.PackedDequant(weight), *(s.ref for s in sources))


def scan(body_fn, init: Tensor, xs: Sequence[Tensor], length: int) -> Tensor:
    """A recurrence: `body_fn(carry, *x_t) -> carry`, traced once into a body graph."""
    from poot.ir.builder import Builder
    from poot.tracer import _current

    b = Builder("scan_body")
    token = _current.set(b)
    try:
        params = [Tensor(b.param(init.type, "carry"))] + [
            Tensor(b.param(TensorType(x.shape[1:], x.dtype), f"x{i}")) for i, x in enumerate(xs)]
        out = body_fn(*params)
        b.result(out.ref)
    finally:
        _current.reset(token)
    return _emit(O.Scan(b.finish(), length), init.ref, *(x.ref for x in xs))


# -- binders and outputs declared from inside a traced function -----------------------------
def const(shape: Sequence[int], dtype, name: str | WeightRef) -> Tensor:
    return Tensor(builder().const(TensorType(tuple(shape), DType.parse(dtype)), name))


def slot(kind: SlotKind | str, shape: Sequence[int], name: str, bound: int | None = None) -> Tensor:
    kind = SlotKind.get(kind) if isinstance(kind, str) else kind
    return Tensor(builder().slot(kind, shape, name, bound))


def state(shape: Sequence[int], dtype, name: str) -> Tensor:
    return Tensor(builder().state(TensorType(tuple(shape), DType.parse(dtype)), name))


def state_update(state_in: Tensor, value: Tensor) -> None:
    """Record `value` as the next step's content of the State binder `state_in`."""
    builder().state_next(state_in.ref, value.ref)


def witness(x: Tensor, label: str) -> Tensor:
    builder().witness(x.ref, label)
    return x


def export(x: Tensor, boundary: str) -> Tensor:
    builder().export(x.ref, boundary)
    return x


def name(x: Tensor, label: str) -> Tensor:
    builder().name_value(x.ref, label)
    return x


def compiler_only(op_name: str):
    raise TraceError(f"{op_name} is introduced by compile; trace its primitive chain instead")
