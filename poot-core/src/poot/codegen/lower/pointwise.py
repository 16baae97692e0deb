"""Pointwise lowerings: one thread per output element.

Elementwise ops, Iota, Broadcast, Transpose, Slice, Concat and Fused regions
all become `out[i] = value(coords(i))`; they differ only in how the value at
a coordinate is read from the operands.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

from poot.codegen import index as ix
from poot.codegen.expr import Expr, Load
from poot.codegen.lower.base import Sig, lowers
from poot.codegen.program import KernelProgram
from poot.codegen.region import RegionEval, scalar_op
from poot.ir.ops import (
    Binary,
    Broadcast,
    Cast,
    Concat,
    Fused,
    Iota,
    Select,
    Slice,
    Transpose,
    Unary,
)

WORKGROUP = 256


def pointwise_kernel(sig: Sig, value: Callable[[Sequence[Expr], object], Expr],
                     declare_inputs: Callable | None = None) -> KernelProgram:
    """out[i] = value(coords of i, builder) for every element of the output.
    `declare_inputs(kb)` declares the operand buffers (default: as their tensor types)."""
    n = sig.out.size
    grid, flat = ix.launch_1d(n, WORKGROUP)
    kb = sig.builder(grid, (WORKGROUP,))
    (declare_inputs or sig.declare_inputs)(kb)
    sig.declare_out(kb)
    i = kb.let("i", flat)
    with kb.if_(ix.lt(i, ix.i32(n))):
        coords = [kb.let(f"c{d}", c) if not isinstance(c, ix.Const) else c
                  for d, c in enumerate(ix.unravel(i, sig.out.shape))]
        kb.store("out", i, value(coords, kb))
    return KernelProgram((kb.finish(),))


@lowers(Unary, Binary, Select, Cast)
def lower_elementwise(sig: Sig) -> KernelProgram:
    return pointwise_kernel(sig, lambda c, kb: scalar_op(
        sig.op, [sig.operand_at(j, c) for j in range(len(sig.ins))]))


@lowers(Iota)
def lower_iota(sig: Sig) -> KernelProgram:
    axis = sig.op.norm_axis(sig.op.axis, sig.out.rank)
    return pointwise_kernel(sig, lambda c, kb: c[axis].cast(sig.out.dtype))


@lowers(Broadcast)
def lower_broadcast(sig: Sig) -> KernelProgram:
    return pointwise_kernel(sig, lambda c, kb: sig.operand_at(0, c))


def _load(sig: Sig, i: int, coords) -> Expr:
    """Operand i at coordinates in its own shape (a literal is its constant)."""
    if i not in sig.tensor_indices():
        return sig.operand_at(i, coords)
    t = sig.type(i)
    return Load(f"in{i}", ix.ravel(coords, t.shape), t.dtype)


@lowers(Transpose)
def lower_transpose(sig: Sig) -> KernelProgram:
    def value(c, kb):
        inner = [None] * sig.out.rank
        for i, p in enumerate(sig.op.perm):
            inner[p] = c[i]
        return _load(sig, 0, inner)
    return pointwise_kernel(sig, value)


@lowers(Slice)
def lower_slice(sig: Sig) -> KernelProgram:
    a = sig.op.norm_axis(sig.op.axis, sig.out.rank)

    def value(c, kb):
        inner = list(c)
        inner[a] = ix.add(c[a], sig.op.start)
        return _load(sig, 0, inner)
    return pointwise_kernel(sig, value)


@lowers(Concat)
def lower_concat(sig: Sig) -> KernelProgram:
    a = sig.op.norm_axis(sig.op.axis, sig.out.rank)

    def value(c, kb):
        out = kb.var("picked", ix.Const(0 if sig.out.dtype.is_int else 0.0, sig.out.dtype))
        offset = 0
        for i in range(len(sig.ins)):
            size = sig.type(i).shape[a]
            inner = list(c)
            inner[a] = ix.sub(c[a], offset)
            within = ix.both(ix.ge(c[a], ix.i32(offset)), ix.lt(c[a], ix.i32(offset + size)))
            with kb.if_(within):
                kb.assign(out, _load(sig, i, inner))
            offset += size
        return out
    return pointwise_kernel(sig, value)


@lowers(Fused)
def lower_fused(sig: Sig) -> KernelProgram:
    body = sig.op.body

    def value(c, kb):
        params = [lambda pc, j=j: _load(sig, j, pc) for j in range(len(sig.ins))]
        return RegionEval(kb, body, params).result_at(c)
    return pointwise_kernel(sig, value)
