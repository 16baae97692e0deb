"""The numpy meaning of the IR's scalar vocabulary (Unary, Binary, Select, Cast, Bitcast).

One rule per op, shared by the oracle's tensor evaluation and by the evaluation
of scalar kernel expressions (poot.codegen.expr), so the two can never disagree.
Floats narrower than F32 compute in F32 and round back once per op.
"""
from __future__ import annotations

import math

import numpy as np

from poot.dtypes import DType
from poot.ir.ops.elementwise import BinaryOp, UnaryOp

_erf = np.vectorize(math.erf, otypes=[np.float64])


def _widen(x: np.ndarray, dtype: DType) -> np.ndarray:
    return x.astype(np.float32) if dtype.is_float and dtype is not DType.F32 else x


def _clz32(x: np.ndarray) -> np.ndarray:
    u = x.view(np.uint32) if x.dtype == np.int32 else x.astype(np.uint32)
    n = np.full(u.shape, 32, np.int64)
    for bit in range(32):  # the highest set bit wins, so scan upward
        n = np.where((u >> np.uint32(bit)) & np.uint32(1), 31 - bit, n)
    return n.astype(x.dtype)


def unary(op: UnaryOp, x: np.ndarray, dtype: DType) -> np.ndarray:
    with np.errstate(all="ignore"):
        if op is UnaryOp.Not:
            return np.invert(x)
        if op is UnaryOp.Clz:
            return _clz32(x)
        if op is UnaryOp.Neg:
            return np.negative(x)
        w = _widen(x, dtype)
        if op is UnaryOp.Exp:
            r = np.exp(w)
        elif op is UnaryOp.Log:
            r = np.log(w)
        elif op is UnaryOp.Sqrt:
            r = np.sqrt(w)
        elif op is UnaryOp.Recip:
            r = np.float32(1) / w
        elif op is UnaryOp.Tanh:
            r = np.tanh(w)
        elif op is UnaryOp.Erf:
            r = _erf(w.astype(np.float64))
        else:  # pragma: no cover
            raise AssertionError(op)
        return np.asarray(r).astype(dtype.numpy)


def _shift_amount(b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    amt = b.astype(np.int64) & 0xFFFFFFFF  # the amount read as an unsigned word
    big = amt >= 32
    return np.where(big, 0, amt), big


def binary(op: BinaryOp, a: np.ndarray, b: np.ndarray, dtype: DType) -> np.ndarray:
    npd = dtype.numpy
    with np.errstate(all="ignore"):
        if op is BinaryOp.Ge:
            return (_widen(a, dtype) >= _widen(b, dtype)).astype(np.int32)
        if op is BinaryOp.GeU:
            return (a.astype(np.uint32) >= b.astype(np.uint32)).astype(np.int32)
        if op is BinaryOp.And:
            return np.bitwise_and(a, b)
        if op is BinaryOp.Or:
            return np.bitwise_or(a, b)
        if op is BinaryOp.Xor:
            return np.bitwise_xor(a, b)
        if op in (BinaryOp.Shl, BinaryOp.Shr):
            amt, big = _shift_amount(b)
            wide = a.astype(np.int64)
            if op is BinaryOp.Shl:
                r = np.where(big, 0, (wide << amt) & 0xFFFFFFFF).astype(np.uint32)
                return r.view(np.int32) if dtype is DType.I32 else r.astype(npd)
            if dtype is DType.I32:  # arithmetic
                r = np.where(big, np.where(wide < 0, -1, 0), wide >> amt)
            else:  # logical
                r = np.where(big, 0, (wide & 0xFFFFFFFF) >> amt)
            return r.astype(npd)
        if dtype.is_int:
            if op is BinaryOp.Div:
                bb = np.where(b == 0, 1, b).astype(np.int64)
                q = _tdiv(a.astype(np.int64), bb)
                return np.where(b == 0, 0, q).astype(npd)
            return INT_BINARY[op](a.astype(np.int64), b.astype(np.int64)).astype(npd)
        return np.asarray(FLOAT_BINARY[op](_widen(a, dtype), _widen(b, dtype))).astype(npd)


#: the arithmetic Binary sub-ops as numpy functions: on floats (16-bit ones widened to
#: F32 first, rounded once after) and on integers (in int64, wrapped to the dtype after;
#: Div has its own rule above). A new arithmetic sub-op adds its function here.
FLOAT_BINARY = {BinaryOp.Add: np.add, BinaryOp.Sub: np.subtract, BinaryOp.Mul: np.multiply,
                BinaryOp.Div: np.divide, BinaryOp.Max: np.maximum, BinaryOp.Min: np.minimum}
INT_BINARY = {BinaryOp.Add: np.add, BinaryOp.Sub: np.subtract, BinaryOp.Mul: np.multiply,
              BinaryOp.Max: np.maximum, BinaryOp.Min: np.minimum}


def _tdiv(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    q = np.abs(a) // np.abs(b)
    return np.where((a < 0) ^ (b < 0), -q, q)


def select(cond: np.ndarray, t: np.ndarray, f: np.ndarray) -> np.ndarray:
    """Bit-for-bit choice: np.where copies the chosen element unchanged."""
    return np.where(cond != 0, t, f)


def cast(x: np.ndarray, src: DType, to: DType) -> np.ndarray:
    if src is to:
        return x
    with np.errstate(all="ignore"):
        if src.is_float and to.is_int:
            w = np.nan_to_num(x.astype(np.float64), nan=0.0)
            info = np.iinfo(to.numpy)
            return np.clip(np.trunc(w), info.min, info.max).astype(to.numpy)
        if src.is_int and to.is_int:
            return x.astype(np.int64).astype(to.numpy)  # wraps
        if src.is_float and to.is_float and src is not DType.F32:
            x = x.astype(np.float32)  # exact widening first, then one rounding
        return x.astype(to.numpy)


def bitcast(x: np.ndarray, to: DType) -> np.ndarray:
    """Reinterpret the bits of each element as `to` (same width)."""
    return np.ascontiguousarray(x).view(to.numpy)
