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

A bf16 checkpoint weight (`Problem.w_dense`) is exact in bf16 already (its lo is 0), so it
gets no planes: the activation is written as two, A' = [hi_a | lo_a] ([M, 2K]), and the
GEMM reads the weight where it lies ([N, K], K-major) once per plane (`wgmma`'s
`w_period`), a depth of 2K: the same sum, hi_a.w + lo_a.w. Activations rounded to bf16
already (the `fast` precision's) have lo_a = 0: the plane writer's workgroups each note
whether theirs had a lo, a small kernel gathers those notes per tile row of the GEMM,
and a tile row without one multiplies only hi_a (depth K: one plane).

Where the split schedule decodes the weight again for every tile row of the output and
takes three mma.sync products per step, this decodes it once: the planes cost
6 (M + N) K bytes of scratch (the plan's step scratch, shared by all steps) and a pass
over them, after which the products run at the matrix unit's rate.
"""
from __future__ import annotations

import contextlib
from dataclasses import replace

from poot.codegen import index as ix
from poot.codegen.expr import Load, Sel, f32, ge, i32, maximum
from poot.codegen.lower import wgmma
from poot.codegen.lower.mma_operands import (
    CHUNK,
    TileOperand,
    Tiles,
    bf16_bits,
    split_unit,
    w_values,
)
from poot.codegen.program import (
    SCRATCH,
    Access,
    BufferParam,
    KernelProgram,
    group_id,
    local_index,
)
from poot.codegen.target import TMA, WGMMA, WIDE_LOADS
from poot.dtypes import DType
from poot.ir.ops import ReduceOp

BF16, F32, I32 = DType.BF16, DType.F32, DType.I32
#: rows from which the planes replace the split schedule; fewer stay on the rows GEMV
#: and the split schedule. A weight read in place (`in_place`) pays from fewer rows than
#: one written to planes each step: an 8B bf16 prefill step of 8 tokens runs as fast exact
#: and 1.8x faster fast on the planes, of 16 and 32 tokens faster in both (docs/performance.md)
PLANE_MIN_ROWS = 64
IN_PLACE_MIN_ROWS = 8
MAX_UNIT = 64          # the longest decode unit a thread holds (else pairs)
PLANE_MAX_BYTES = 1 << 30   # the most scratch the planes may take (else the split schedule)
THREADS = 256
PLANES = 3


def usable(p, features) -> bool:
    """Whether `p` takes the planes: a target with the warpgroup GEMM, F32 accumulation
    of one batch, operands it cannot copy as they are but can split (`split_unit`), at
    least PLANE_MIN_ROWS rows (IN_PLACE_MIN_ROWS for a weight read in place), N and K in
    whole 16-byte chunks, planes within PLANE_MAX_BYTES."""
    rows = IN_PLACE_MIN_ROWS if in_place(p) else PLANE_MIN_ROWS
    return (WGMMA in features and TMA in features and p.tiles is None and p.batch == 1
            and p.parts == 1 and not p.w_per_row and p.acc is F32 and p.m >= rows
            and p.n % CHUNK == 0 and p.k % CHUNK == 0 and split_unit(p) is not None
            and 2 * PLANES * p.k * (p.m + p.n) <= PLANE_MAX_BYTES)


def in_place(p) -> bool:
    """Whether `p`'s weight is read where it lies (module doc): bf16 [N, K], K in whole
    K steps of the GEMM and whole plane-writer workgroups."""
    return (p.w_dense is not None and p.w_dense[1] is BF16 and p.k % wgmma.BOX == 0
            and p.k % THREADS == 0)


def program(p, sig, declare, inputs=None) -> KernelProgram:
    """The three kernels, or two for a weight read in place (module doc); `declare`
    declares the GEMM's buffers (the eqn's operands and output), `inputs` those the
    planes read (default: every operand)."""
    read = inputs or (lambda kb: sig.declare_inputs(kb, p.views))
    if in_place(p):
        return _in_place_program(p, sig, declare, read)
    depth = PLANES * p.k
    a_planes = BufferParam("a_planes", BF16, Access.READ_WRITE, p.m * depth, SCRATCH)
    w_planes = BufferParam("w_planes", BF16, Access.READ_WRITE, depth * p.n, SCRATCH)
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
    _activation_planes(p, sig, read, a_planes, kernels, lambda hi, lo: (hi, hi, lo))

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


def _in_place_program(p, sig, declare, read) -> KernelProgram:
    """The activation's two planes (and each writer workgroup's note of a lo), the notes
    per tile row, then the GEMM over the planes and the weight as it lies (a second view
    of its operand, as bf16 elements, for the tensor map)."""
    depth, (operand, _) = 2 * p.k, p.w_dense
    a_planes = BufferParam("a_planes", BF16, Access.READ_WRITE, p.m * depth, SCRATCH)
    zero = lambda b: i32(0)  # noqa: E731
    q = replace(p, k=depth, tiles=Tiles(TileOperand(a_planes.name, BF16, True, zero),
                                        TileOperand("w_tile", BF16, True, zero)))
    bm = wgmma.schedule_for(q).bm
    notes = BufferParam("lo_notes", I32, Access.READ_WRITE, p.m * p.k // THREADS, SCRATCH)
    rows = BufferParam("lo_rows", I32, Access.READ_WRITE, -(-p.m // bm), SCRATCH)
    kernels = []
    _activation_planes(p, sig, read, a_planes, kernels, lambda hi, lo: (hi, lo), notes)
    kernels.append(_gather_notes(p, sig, notes, rows, bm))

    def declare_gemm(kb):
        declare(kb)
        kb.buffer(a_planes.name, BF16, Access.READ, a_planes.count, SCRATCH)
        kb.buffer(rows.name, I32, Access.READ, rows.count, SCRATCH)
        kb.buffer("w_tile", BF16, Access.READ, p.n * p.k, operand)

    gemm = wgmma.wgmma_gemm_kernel(q, sig.builder, declare_gemm,
                                   wide=WIDE_LOADS in sig.features, w_period=p.k,
                                   period_flags=rows.name)
    return KernelProgram((*kernels, gemm), scratch=(a_planes, notes, rows))


def _activation_planes(p, sig, read, a_planes: BufferParam, kernels: list, order,
                       notes: BufferParam | None = None) -> None:
    """The kernel writing the activation's planes: row m of `a_planes` holds, plane after
    plane, `order(hi, lo)` of the row's K values; with `notes`, each workgroup's
    indicator of a nonzero lo among its THREADS values (whole workgroups: THREADS
    divides K, `in_place`)."""
    depth = a_planes.count // p.m
    with _writer(sig, read, a_planes, p.m * p.k, kernels, notes) as (kb, i):
        m, k = kb.let("m", ix.div(i, p.k)), kb.let("k", ix.mod(i, p.k))
        x = kb.let("x", p.a(i32(0), m, k))
        hi, lo = _parts(kb, x)
        at = kb.let("at", ix.add(ix.mul(m, depth), k))
        for plane, v in enumerate(order(hi, lo)):
            kb.store(a_planes.name, ix.add(at, plane * p.k), v)
        if notes is not None:
            r = kb.let("r", x - hi.cast(F32))
            some = kb.reduce("lo", ReduceOp.Max, i32(1) - ge(r, f32(0.0)) * ge(f32(0.0), r))
            with kb.if_(ix.eq(local_index(), i32(0))):
                kb.store(notes.name, ix.div(i, THREADS), some)


def _gather_notes(p, sig, notes: BufferParam, rows: BufferParam, bm: int):
    """A workgroup per tile row of `bm` rows: whether any writer workgroup of its rows
    noted a lo (`rows`[t], 0 or 1)."""
    per, count = bm * p.k // THREADS, notes.count
    kb = sig.builder((rows.count,), (THREADS,), "_lorows")
    kb.buffer(notes.name, I32, Access.READ, count, SCRATCH)
    kb.buffer(rows.name, I32, Access.WRITE, rows.count, SCRATCH)
    first = kb.let("first", ix.mul(group_id(0), per))
    some = i32(0)
    for u in range(-(-per // THREADS)):
        j = kb.let("j", ix.add(first, ix.add(local_index(), u * THREADS)))
        some = maximum(some, Sel(ix.lt(j, i32(count)),
                                 Load(notes.name, ix.minimum(j, i32(count - 1)), I32), i32(0)))
    some = kb.reduce("lo", ReduceOp.Max, kb.let("some", some))
    with kb.if_(ix.eq(local_index(), i32(0))):
        kb.store(rows.name, group_id(0), some)
    return kb.finish()


@contextlib.contextmanager
def _writer(sig, read, planes: BufferParam, count: int, kernels: list,
            notes: BufferParam | None = None):
    """A kernel of a thread per item 0 .. count - 1 that writes `planes` (and `notes`;
    appended to `kernels` when done): yields its builder and the item, inside the guard
    of the threads past the last."""
    grid, flat = ix.launch_1d(count, THREADS)
    kb = sig.builder(grid, (THREADS,), "_" + planes.name.replace("_", ""))
    read(kb)
    kb.buffer(planes.name, BF16, Access.WRITE, planes.count, SCRATCH)
    if notes is not None:
        kb.buffer(notes.name, I32, Access.WRITE, notes.count, SCRATCH)
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
