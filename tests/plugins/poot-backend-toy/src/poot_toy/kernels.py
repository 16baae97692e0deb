"""The toy's own kernels: one numpy routine per declared op key, writing into `out`.

They compute in float64 and round once to float32 (the oracle computes in float32),
so the suite's NMSE thresholds, not bit equality, are what they must meet.
"""
from __future__ import annotations

import math

import numpy as np

_erf = np.vectorize(math.erf, otypes=[np.float64])


def _f64(x):
    return np.asarray(x, np.float64)


UNARY = {
    "Neg": lambda x: -_f64(x),
    "Exp": lambda x: np.exp(_f64(x)),
    "Log": lambda x: np.log(_f64(x)),
    "Sqrt": lambda x: np.sqrt(_f64(x)),
    "Recip": lambda x: 1.0 / _f64(x),
    "Tanh": lambda x: np.tanh(_f64(x)),
    "Erf": lambda x: _erf(_f64(x)),
}
BINARY = {
    "Add": lambda a, b: _f64(a) + _f64(b),
    "Sub": lambda a, b: _f64(a) - _f64(b),
    "Mul": lambda a, b: _f64(a) * _f64(b),
    "Div": lambda a, b: _f64(a) / _f64(b),
    "Max": lambda a, b: np.maximum(_f64(a), _f64(b)),
    "Min": lambda a, b: np.minimum(_f64(a), _f64(b)),
}


def reduce_kernel(kind: str, axis: int, keepdim: bool):
    fn = np.sum if kind == "Sum" else np.max
    return lambda x: fn(_f64(x), axis=axis, keepdims=keepdim)


def kernel_for(family: str, name: str, op):
    """fn(*operand arrays) -> float64 result for one op key ("Binary", "Add")."""
    if family == "Unary":
        return UNARY[name]
    if family == "Binary":
        return BINARY[name]
    return reduce_kernel(name, op.axis, op.keepdim)
