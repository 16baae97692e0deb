"""Contractions of many rows whose operands tensor cores cannot read as they lie (packed
weights, or 16-bit weights beside F32 activations), on targets with the warpgroup GEMM
(`poot.codegen.lower.wgmma`): each operand is written once as bf16 planes, then one
warpgroup GEMM multiplies them.

A value x becomes hi = x rounded to bf16 and lo = x - hi rounded to bf16, so a product
a * w is hi_a * hi_w + hi_a * lo_w + lo_a * hi_w within about 2^-16 of its size: the
arithmetic of the split tensor-core schedule (`mma_operands.SplitTiles`). Laid out along
K as three planes, A' = [hi_a | hi_a | lo_a] ([M, 3K]) and W' = [hi_w; lo_w; hi_w]
([3K, N]: the GEMM's [K, N] weight), that sum is the one product A' W' of depth 3K,
accumulated in F32 by the warpgroup GEMM, which stores through the problem's own store
(its epilogue). Three kernels: the weight planes (a thread per column and decode unit of
K, consecutive threads on consecutive columns so each plane row is written in whole
lines), the activation planes (a thread per element), the GEMM.

Where the split schedule decodes the weight again for every tile row of the output and
takes three mma.sync products per step, this decodes it once: the planes cost
6 (M + N) K bytes of scratch (the plan's step scratch, shared by all steps) and a pass
over them, after which the products run at the matrix unit's rate.
"""
from __future__ import annotations

import contextlib
from dataclasses import replace

from poot.codegen import index as ix
from poot.codegen.expr import i32
from poot.codegen.lower import wgmma
from poot.codegen.lower.mma_operands import (
    CHUNK,
    TileOperand,
    Tiles,
    bf16_bits,
    split_unit,
    w_values,
)
from poot.codegen.program import SCRATCH, Access, BufferParam, KernelProgram
from poot.codegen.target import TMA, WGMMA, WIDE_LOADS
from poot.dtypes import DType

BF16, F32 = DType.BF16, DType.F32
#: rows from which the planes replace the split schedule; fewer stay on the rows GEMV
#: and the split schedule (planes from 16 rows did not speed up an 8B prefill step of 32
#: tokens: docs/performance.md)
PLANE_MIN_ROWS = 64
MAX_UNIT = 64          # the longest decode unit a thread holds (else pairs)
PLANE_MAX_BYTES = 1 << 30   # the most scratch the planes may take (else the split schedule)
THREADS = 256
PLANES = 3


def usable(p, features) -> bool:
    """Whether `p` takes the planes: a target with the warpgroup GEMM, F32 accumulation
    of one batch, operands it cannot copy as they are but can split (`split_unit`), at
    least PLANE_MIN_ROWS rows, N and K in whole 16-byte chunks, planes within
    PLANE_MAX_BYTES."""
    return (WGMMA in features and TMA in features and p.tiles is None and p.batch == 1
            and p.parts == 1 and not p.w_per_row and p.acc is F32 and p.m >= PLANE_MIN_ROWS
            and p.n % CHUNK == 0 and p.k % CHUNK == 0 and split_unit(p) is not None
            and 2 * PLANES * p.k * (p.m + p.n) <= PLANE_MAX_BYTES)


def program(p, sig, declare, inputs=None) -> KernelProgram:
    """The three kernels (module doc); `declare` declares the GEMM's buffers (the eqn's
    operands and output), `inputs` those the planes read (default: every operand)."""
    depth = PLANES * p.k
    a_planes = BufferParam("a_planes", BF16, Access.READ_WRITE, p.m * depth, SCRATCH)
    w_planes = BufferParam("w_planes", BF16, Access.READ_WRITE, depth * p.n, SCRATCH)
    read = inputs or (lambda kb: sig.declare_inputs(kb, p.views))
    kernels = []

    unit = split_unit(p)
    unit = unit if unit <= MAX_UNIT else 2
    with _writer(sig, read, w_planes, p.n * (p.k // unit), kernels) as (kb, i):
        n, k0 = kb.let("n", ix.mod(i, p.n)), kb.let("k0", ix.mul(ix.div(i, p.n), unit))
        for j, w in enumerate(w_values(p, i32(0), n, k0, unit)):
            hi, lo = _parts(kb, w)
            row = kb.let("row", ix.add(ix.mul(ix.add(k0, j), p.n), n))
            for plane, v in enumerate((hi, lo, hi)):
                kb.store(w_planes.name, ix.add(row, plane * p.k * p.n), v)
    with _writer(sig, read, a_planes, p.m * p.k, kernels) as (kb, i):
        m, k = kb.let("m", ix.div(i, p.k)), kb.let("k", ix.mod(i, p.k))
        hi, lo = _parts(kb, p.a(i32(0), m, k))
        at = kb.let("at", ix.add(ix.mul(m, depth), k))
        for plane, v in enumerate((hi, hi, lo)):
            kb.store(a_planes.name, ix.add(at, plane * p.k), v)

    def declare_gemm(kb):
        declare(kb)
        for b in (a_planes, w_planes):
            kb.buffer(b.name, BF16, Access.READ, b.count, SCRATCH)

    zero = lambda b: i32(0)  # noqa: E731
    q = replace(p, k=depth, tiles=Tiles(TileOperand(a_planes.name, BF16, True, zero),
                                        TileOperand(w_planes.name, BF16, False, zero)))
    gemm = wgmma.wgmma_gemm_kernel(q, sig.builder, declare_gemm,
                                   wide=WIDE_LOADS in sig.features)
    return KernelProgram((*kernels, gemm), scratch=(w_planes, a_planes))


@contextlib.contextmanager
def _writer(sig, read, planes: BufferParam, count: int, kernels: list):
    """A kernel of a thread per item 0 .. count - 1 that writes `planes` (appended to
    `kernels` when done): yields its builder and the item, inside the guard of the
    threads past the last."""
    grid, flat = ix.launch_1d(count, THREADS)
    kb = sig.builder(grid, (THREADS,), "_" + planes.name.replace("_", ""))
    read(kb)
    kb.buffer(planes.name, BF16, Access.WRITE, planes.count, SCRATCH)
    i = kb.let("i", flat)
    with kb.if_(ix.lt(i, i32(count))):
        yield kb, i
    kernels.append(kb.finish())


def _parts(kb, x):
    """x's hi and lo bf16 parts (module doc)."""
    x = kb.let("x", x)
    hi = kb.let("hi", bf16_bits(x).bitcast(F32))
    lo = bf16_bits(x - hi).bitcast(F32)
    return hi.cast(BF16), lo.cast(BF16)
