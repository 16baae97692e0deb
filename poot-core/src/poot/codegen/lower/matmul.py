"""MatMul (batched, numpy broadcasting of batch axes) and IndexedMatMul (MoE experts)."""
from __future__ import annotations

import math

from poot.codegen import index as ix
from poot.codegen.expr import Load
from poot.codegen.lower import mma_operands as mma
from poot.codegen.lower.base import Sig
from poot.codegen.lower.dot import problem_for
from poot.codegen.lower.output import store_flat
from poot.codegen.lower.problem import Problem
from poot.dtypes import DType
from poot.ir.ops import IndexedMatMul, MatMul


def accumulator(dtype: DType) -> DType:
    return DType.F32 if dtype.is_float else DType.I32


def batch_offset(b, batch_shape, operand_batch, matrix_size):
    """Element offset of broadcast batch `b` inside an operand with batch axes `operand_batch`."""
    coords = ix.broadcast_coords(ix.unravel(b, batch_shape), operand_batch)
    return ix.mul(ix.ravel(coords, operand_batch), matrix_size)


@problem_for(MatMul)
def matmul_problem(sig: Sig, epilogue) -> Problem:
    a, w = sig.type(0), sig.type(1)
    m, k, n = a.shape[-2], a.shape[-1], w.shape[-1]
    batch_shape = sig.out.shape[:-2]
    acc = accumulator(a.dtype)

    def a_elem(b, mm, kk):
        off = batch_offset(b, batch_shape, a.shape[:-2], m * k)
        return Load("in0", ix.add(off, ix.add(ix.mul(mm, k), kk)), a.dtype).cast(acc)

    def w_elem(b, mm, nn, kk):
        off = batch_offset(b, batch_shape, w.shape[:-2], k * n)
        return Load("in1", ix.add(off, ix.add(ix.mul(kk, n), nn)), w.dtype).cast(acc)

    tiles = mma.tiles_for(
        n, k,
        mma.TileOperand("in0", a.dtype, True,
                        lambda b: batch_offset(b, batch_shape, a.shape[:-2], m * k)),
        mma.TileOperand("in1", w.dtype, False,
                        lambda b: batch_offset(b, batch_shape, w.shape[:-2], k * n)))
    return Problem(math.prod(batch_shape), m, n, k, a_elem, w_elem,
                   store_flat(sig, m, n, epilogue), acc, tiles=tiles)


@problem_for(IndexedMatMul)
def indexed_matmul_problem(sig: Sig, epilogue) -> Problem:
    x, w, idx = sig.type(0), sig.type(1), sig.type(2)
    m, k = x.shape
    e, _, n = w.shape
    acc = accumulator(x.dtype)

    def a_elem(b, mm, kk):
        return Load("in0", ix.add(ix.mul(mm, k), kk), x.dtype).cast(acc)

    def w_elem(b, mm, nn, kk):
        expert = ix.clamp(Load("in2", mm, idx.dtype), 0, e - 1)
        return Load("in1", ix.add(ix.mul(expert, k * n), ix.add(ix.mul(kk, n), nn)),
                    w.dtype).cast(acc)

    return Problem(1, m, n, k, a_elem, w_elem, store_flat(sig, m, n, epilogue), acc,
                   w_per_row=True)
