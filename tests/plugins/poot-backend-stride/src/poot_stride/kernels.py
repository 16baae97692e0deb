"""One kernel per op: fn(out, *operands) writes the result into `out` (a numpy view of
the planned place) from operand views, which may be strided. Contractions accumulate in
float64 in K blocks and round once."""
from __future__ import annotations

import numpy as np

K_BLOCK = 1024


def _binary(name: str):
    fn = {"Add": np.add, "Sub": np.subtract, "Mul": np.multiply, "Max": np.maximum}[name]

    def kernel(out, a, b):
        fn(a, b, out=out, casting="unsafe")   # numpy's own wraparound for i32
    return kernel


def _matmul(out, a, b):
    acc = 0.0
    for k0 in range(0, a.shape[-1], K_BLOCK):
        acc = acc + np.matmul(a[..., k0:k0 + K_BLOCK].astype(np.float64),
                              b[..., k0:k0 + K_BLOCK, :].astype(np.float64))
    out[...] = acc


def _scatter(out, base, src, slots):
    if not np.shares_memory(out, base):   # not donated in place: start from the base
        out[...] = base
    for row, slot in enumerate(slots.reshape(-1)):
        if slot >= 0:                     # -1 writes nothing; a later row wins
            out[slot] = src[row]


def _update_slice(axis: int):
    def kernel(out, x, update, index):
        if not np.shares_memory(out, x):
            out[...] = x
        n = update.shape[axis]
        at = min(max(int(index.reshape(-1)[0]), 0), x.shape[axis] - n)   # clamped
        sel = [slice(None)] * out.ndim
        sel[axis] = slice(at, at + n)
        out[tuple(sel)] = update
    return kernel


def for_op(op):
    """The kernel of one eqn's op."""
    name = op.name
    if name == "Binary":
        return _binary(op.op.name)
    if name == "MatMul":
        return _matmul
    if name == "Cast":
        return lambda out, x: np.copyto(out, x, casting="unsafe")
    if name == "Select":
        return lambda out, c, t, f: np.copyto(out, np.where(c != 0, t, f))
    if name == "Broadcast":
        return lambda out, x: np.copyto(out, np.broadcast_to(x, op.shape))
    if name == "Transpose":
        return lambda out, x: np.copyto(out, x.transpose(op.perm))
    if name == "Slice":
        def kernel(out, x):
            sel = [slice(None)] * x.ndim
            sel[op.axis] = slice(op.start, op.end)
            out[...] = x[tuple(sel)]
        return kernel
    if name == "Concat":
        return lambda out, *xs: np.concatenate(xs, axis=op.axis, out=out)
    if name == "Gather":
        return lambda out, src, idx: np.copyto(out, np.take(src, idx, axis=op.axis))
    if name == "ScatterUpdate":
        return _scatter
    if name == "DynamicUpdateSlice":
        return _update_slice(op.axis)
    raise AssertionError(f"stride: no kernel for {name} (its table does not declare it)")
