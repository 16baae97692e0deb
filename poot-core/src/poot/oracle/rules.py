"""The oracle's rule for each primitive: numpy, exact to the spec's semantics.

A rule takes (op, args, in_types, out_type) and returns the output array.
Composites have no rule here: the oracle evaluates their primitive definition.
"""
from __future__ import annotations

from collections.abc import Callable

import numpy as np

from poot.dtypes import DType
from poot.errors import OutOfRange
from poot.ir import ops as O
from poot.oracle import scalar as S

Rule = Callable[..., np.ndarray]
RULES: dict[type, Rule] = {}


def rule(*classes):
    def deco(fn):
        for c in classes:
            RULES[c] = fn
        return fn
    return deco


def _check_index(idx: np.ndarray, size: int, op: str, allow_minus_one=False) -> None:
    if idx.size == 0:
        return
    lo = -1 if allow_minus_one else 0
    if idx.min() < lo or idx.max() >= size:
        bad = idx[(idx < lo) | (idx >= size)].reshape(-1)[0]
        raise OutOfRange(f"{op}: index {int(bad)} outside [{lo}, {size})")


@rule(O.Unary)
def _unary(op, args, ins, out):
    return S.unary(op.op, args[0], ins[0].dtype)


@rule(O.Binary)
def _binary(op, args, ins, out):
    a, b = np.broadcast_arrays(*args)
    return S.binary(op.op, a, b, ins[0].dtype)


@rule(O.Select)
def _select(op, args, ins, out):
    return S.select(*args)


@rule(O.Cast)
def _cast(op, args, ins, out):
    return S.cast(args[0], ins[0].dtype, op.to)


@rule(O.Iota)
def _iota(op, args, ins, out):
    shape = [1] * len(op.shape)
    shape[op.axis] = op.shape[op.axis]
    r = np.arange(op.shape[op.axis]).reshape(shape)
    return np.broadcast_to(r, op.shape).astype(out.dtype.numpy)


@rule(O.Broadcast)
def _broadcast(op, args, ins, out):
    return np.broadcast_to(args[0], op.shape)


@rule(O.Reshape)
def _reshape(op, args, ins, out):
    return np.reshape(args[0], op.shape)


@rule(O.Transpose)
def _transpose(op, args, ins, out):
    return np.transpose(args[0], op.perm)


@rule(O.Slice)
def _slice(op, args, ins, out):
    x = args[0]
    sl = [slice(None)] * x.ndim
    sl[op.axis] = slice(op.start, op.end)
    return x[tuple(sl)]


@rule(O.Concat)
def _concat(op, args, ins, out):
    return np.concatenate(args, axis=op.axis)


@rule(O.Gather)
def _gather(op, args, ins, out):
    src, idx = args
    axis = op.axis % src.ndim
    _check_index(idx, src.shape[axis], "Gather")
    return np.take(src, idx, axis=axis)


@rule(O.ScatterUpdate)
def _scatter(op, args, ins, out):
    base, src, slots = args
    _check_index(slots, base.shape[0], "ScatterUpdate", allow_minus_one=True)
    res = np.array(base, copy=True)
    keep = slots >= 0
    rows, where = src[keep], slots[keep]
    # later rows win: keep the last occurrence of each slot
    _, last = np.unique(where[::-1], return_index=True)
    pick = len(where) - 1 - last
    res[where[pick]] = rows[pick]
    return res


@rule(O.DynamicUpdateSlice)
def _dus(op, args, ins, out):
    x, upd, index = args
    axis = op.axis % x.ndim
    start = int(np.clip(int(index.reshape(-1)[0]), 0, x.shape[axis] - upd.shape[axis]))
    res = np.array(x, copy=True)
    sl = [slice(None)] * x.ndim
    sl[axis] = slice(start, start + upd.shape[axis])
    res[tuple(sl)] = upd
    return res


@rule(O.ArgTopK)
def _argtopk(op, args, ins, out):
    x = args[0].astype(np.float64)
    order = np.argsort(-x, axis=-1, kind="stable")
    return order[..., : op.k].astype(np.int32)


@rule(O.Reduce)
def _reduce(op, args, ins, out):
    x, dtype = args[0], ins[0].dtype
    if op.op is O.ReduceOp.Max:
        return np.max(x, axis=op.axis, keepdims=op.keepdim)
    if dtype.is_float:
        r = np.sum(x.astype(np.float32), axis=op.axis, keepdims=op.keepdim, dtype=np.float32)
    else:
        r = np.sum(x.astype(np.int64), axis=op.axis, keepdims=op.keepdim)
    return np.asarray(r).astype(dtype.numpy)


#: elements of an operand whose last axis is strided above which `contiguous` copies it a
#: block of columns at a time, and the columns of a block (its source rows stay in cache)
_BLOCKED_COPY, _BLOCK_COLUMNS = 1 << 20, 256


def contiguous(x: np.ndarray, dtype=None) -> np.ndarray:
    """`np.ascontiguousarray(x, dtype)`. A large operand whose last axis is strided (a
    transposed weight) is copied a block of columns at a time: numpy's copy in the result's
    order misses the cache on nearly every read of it."""
    if dtype is not None and np.dtype(dtype) != x.dtype or x.ndim < 2 or \
            x.size < _BLOCKED_COPY or x.strides[-1] == x.itemsize or x.flags.c_contiguous:
        return np.ascontiguousarray(x, dtype)
    out = np.empty(x.shape, x.dtype)
    for i in range(0, x.shape[-1], _BLOCK_COLUMNS):
        out[..., i: i + _BLOCK_COLUMNS] = x[..., i: i + _BLOCK_COLUMNS]
    return out


def _contract(a: np.ndarray, b: np.ndarray, dtype: DType, sub: str | None = None) -> np.ndarray:
    """On C-contiguous copies: numpy sums a product in an order that depends on its
    operands' strides, and the meaning must not depend on where a planner put them."""
    acc = np.float32 if dtype.is_float else np.int64
    a, b = contiguous(a, acc), contiguous(b, acc)
    r = np.einsum(sub, a, b) if sub else np.matmul(a, b)
    return np.asarray(r).astype(dtype.numpy)


@rule(O.MatMul)
def _matmul(op, args, ins, out):
    return _contract(args[0], args[1], ins[0].dtype)


@rule(O.IndexedMatMul)
def _indexed_matmul(op, args, ins, out):
    x, w, idx = args
    _check_index(idx, w.shape[0], "IndexedMatMul")
    return _contract(x, w[idx], ins[0].dtype, "mk,mkn->mn")


@rule(O.QuantizeI8)
def _quantize_i8(op, args, ins, out):
    x, d = (np.asarray(a, np.float32) for a in np.broadcast_arrays(*args))
    # every step an F32 operation, as the op states: 1 / d, x * inv, then exact rounding
    inv = np.where(d == 0, np.float32(0), np.float32(1) / np.where(d == 0, np.float32(1), d))
    y = np.multiply(x, inv.astype(np.float32), dtype=np.float32)
    y = np.clip(np.where(np.isnan(y), np.float32(0), y), -O.Q8_MAX, O.Q8_MAX)
    return np.rint(y).astype(np.int8)


@rule(O.PackedDequant)
def _packed_dequant(op, args, ins, out):
    r = op.weight.dequantize(args)
    return np.asarray(r, dtype=np.float32).reshape(op.weight.shape)


