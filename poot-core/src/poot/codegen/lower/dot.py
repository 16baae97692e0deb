"""The dot-product kernels every matmul-like op shares: out[b, m, n] = sum_k a * w.

An op describes its operands as element functions (`problem.Problem`, registered by
`problem_for`); this module picks the schedule that computes it, by rows and by what the
target declares, each in a module of its own and tuned by the target's `DotSchedule`
(`poot.codegen.lower.schedule`):

* GEMV (at most GEMV_MAX_ROWS rows: decode), and weights that differ per row
  (IndexedMatMul, MoE): `gemv`, walking packed weights by runs (`runs`), or by the
  integer GEMV on a DOT2 target (`int_gemv`), whose K may split into parts (two kernels,
  `contraction_program`).
* Rows GEMV (a decode batch, up to `DotSchedule.batch_rows` rows): `rows_gemv`.
* Tiled GEMM (many rows, prefill): `gemm`.
* Tensor cores (`mma`), on targets with a matrix unit, ahead of the two above: 16-bit
  operands as they lie from 64 rows (`wgmma` on targets with the warpgroup GEMM); F32
  activations with packed or 16-bit weights split into bf16 parts past the rows GEMV's
  rows, and over a head's wide N from 16 rows (`mma.decode_schedule`). On targets with
  the warpgroup GEMM such operands are instead written once as bf16 planes that it
  multiplies (`planes`), from 64 rows.

Int8 rows (`Problem.q8`, Q8PackedContraction) take the integer GEMV, which quantizes
them by the composite's rule; where it does not apply (many rows, a target without DOT2,
a format without integer runs) a kernel first writes the rows rounded so (`_q8_apart`),
and the contraction of those rows takes any schedule above.

A gated contraction (`Problem.pair`) joins its column pairs in the workgroup of the GEMV
or the rows GEMV (`gemv`); where neither applies, the contraction writes [M, N] and a
kernel joins the pairs (`_pair_apart`). A row norm (`Problem.row_norm`) rides in the GEMV where one
kernel sees whole rows, else a kernel of its own runs first (`_norm_apart`).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from poot.codegen import index as ix
from poot.codegen.builder import KernelBuilder
from poot.codegen.expr import Load, f32, i32, maximum
from poot.codegen.lower import mma, planes, wgmma
from poot.codegen.lower.gemm import gemm_kernel
from poot.codegen.lower.gemv import gemv_kernel, gemv_slots
from poot.codegen.lower.int_gemv import int_parts, int_plan, k_parts
from poot.codegen.lower.problem import Problem, Rows
from poot.codegen.lower.quantize import quantize_i8
from poot.codegen.lower.schedule import GEMV_MAX_ROWS, DotSchedule
from poot.codegen.program import SCRATCH, Access, BufferParam, KernelProgram, local_index
from poot.codegen.target import WIDE_LOADS
from poot.dtypes import DType
from poot.ir.ops import Q8_BLOCK, Q8_MAX, ReduceOp

#: threads a workgroup of the small kernels beside a contraction (the parts' sum, the
#: pairs' join): one thread per output
THREADS = 256

#: op class -> problem(sig, store) -> Problem; ops whose kernels are contractions
PROBLEMS: dict[type, Callable] = {}


def problem_for(*op_types: type):
    """Register how an op states its contraction; it lowers through the shared schedules."""
    from poot.codegen.lower.base import lowers

    def deco(fn):
        for t in op_types:
            PROBLEMS[t] = fn
        lowers(*op_types, scheduled=True)(lower_contraction)
        return fn
    return deco


def lower_contraction(sig):
    p = PROBLEMS[type(sig.op)](sig, None)
    return contraction_program(p, sig, lambda kb: sig.declare_all(kb, p.views))


def contraction_program(p: Problem, sig, declare: Callable[[KernelBuilder], None],
                        inputs: Callable[[KernelBuilder], None] | None = None):
    """The kernels of `p`: its schedule's one, or a split integer GEMV's two
    (`int_gemv.int_parts`): the parts' partial sums go to scratch [parts, M, N], then one
    thread per output adds them in part order and stores through `p.store`. A problem with
    a row norm takes it in the GEMV where that is one kernel (`_norm_inside`), else runs
    it first. Where the bf16 planes apply (`planes.usable`), their three kernels.
    `declare` declares a kernel's buffers, `inputs` only those it reads (default: the
    eqn's operands). The schedules are tuned by `sig.dot_schedule`."""
    s = sig.dot_schedule
    if p.q8 and not _q8_inside(p, sig.features, s):
        return _q8_apart(p, sig, declare)
    parts = int_parts(p, sig.features, s)
    norm_apart = p.row_norm is not None and not (parts == 1 and _norm_inside(p, s))
    if p.pair is not None and (parts > 1 or norm_apart or not _pairs_inside(p, sig)):
        return _pair_apart(p, sig, declare, inputs)
    if norm_apart:
        return _norm_apart(p, sig, declare)
    if planes.usable(p, sig.features):
        return planes.program(p, sig, declare, inputs)
    if parts == 1:
        return KernelProgram((contraction_kernel(p, sig, declare),))
    count = p.m * p.n
    scratch = BufferParam("k_parts", DType.F32, Access.READ_WRITE, parts * count, SCRATCH)

    def store_part(kb, b, m, n, acc):
        kb.store(scratch.name, ix.add(ix.mul(ix.add(ix.mul(b, p.m), m), p.n), n), acc)

    def declare_first(kb):
        (inputs or (lambda kb: sig.declare_inputs(kb, p.views)))(kb)
        kb.buffer(scratch.name, DType.F32, Access.WRITE, scratch.count, SCRATCH)

    first = gemv_kernel(k_parts(p, parts, store_part), sig.builder, declare_first,
                        sig.features, s)
    grid, flat = ix.launch_1d(count, THREADS)
    kb = sig.builder(grid, (THREADS,), "_parts")
    declare(kb)
    kb.buffer(scratch.name, DType.F32, Access.READ, scratch.count, SCRATCH)
    i = kb.let("i", flat)
    with kb.if_(ix.lt(i, i32(count))):
        total = Load(scratch.name, i, DType.F32)
        for part in range(1, parts):
            total = total + Load(scratch.name, ix.add(i, part * count), DType.F32)
        p.store(kb, i32(0), kb.let("m", ix.div(i, p.n)), kb.let("n", ix.mod(i, p.n)),
                kb.let("dot", total))
    return KernelProgram((first, kb.finish()), scratch=(scratch,))


def _pairs_inside(p: Problem, sig) -> bool:
    """Whether a GEMV computes gated `p` in one kernel whose workgroups hold whole pairs
    of columns for every row: the GEMV, or the rows GEMV where its row tiles of a set of
    columns lie in one workgroup."""
    if p.batch != 1 or p.w_per_row:
        return False
    many = p.m > GEMV_MAX_ROWS
    if many and not _rows_gemv_takes(p, sig):
        return False
    slots = gemv_slots(p, sig.features, sig.dot_schedule, many)
    return slots > 0 and slots % 2 == 0


def _rows_gemv_takes(p: Problem, sig) -> bool:
    """Whether `p`, of more rows than the GEMV's, takes the rows GEMV: up to its batch,
    where no tensor-core schedule (nor the planes) applies."""
    f = sig.features
    return (GEMV_MAX_ROWS < p.m <= sig.dot_schedule.batch_rows and not p.w_per_row
            and not planes.usable(p, f) and not wgmma.usable(p, f) and not mma.usable(p, f)
            and mma.decode_schedule(p, f) is None)


def _pair_apart(p: Problem, sig, declare, inputs) -> KernelProgram:
    """A gated contraction where its GEMV cannot join the halves: the contraction's
    kernels store [M, N] to scratch, then one thread per output joins its two columns."""
    half, count = p.n // 2, p.batch * p.m * p.n
    both = BufferParam("halves", p.acc, Access.READ_WRITE, count, SCRATCH)

    def store(kb, b, m, n, acc):
        kb.store(both.name, ix.add(ix.mul(ix.add(ix.mul(b, p.m), m), p.n), n), acc)

    def reading(access):
        def declare_with(kb):
            (inputs or (lambda kb: sig.declare_inputs(kb, p.views)))(kb)
            kb.buffer(both.name, p.acc, access, count, SCRATCH)
        return declare_with
    first = contraction_program(replace(p, pair=None, store=store), sig,
                                reading(Access.WRITE), reading(Access.WRITE))
    outputs = p.batch * p.m * half
    grid, flat = ix.launch_1d(outputs, THREADS)
    kb = sig.builder(grid, (THREADS,), "_gate")
    declare(kb)
    kb.buffer(both.name, p.acc, Access.READ, count, SCRATCH)
    o = kb.let("o", flat)
    with kb.if_(ix.lt(o, i32(outputs))):
        row, i = kb.let("row", ix.div(o, half)), kb.let("i", ix.mod(o, half))
        at = kb.let("at", ix.add(ix.mul(row, p.n), i))
        p.pair(kb, row, i, kb.let("lo", Load(both.name, at, p.acc)),
               kb.let("hi", Load(both.name, ix.add(at, half), p.acc)))
    return KernelProgram((*first.kernels, kb.finish()), scratch=(*first.scratch, both))


def _q8_inside(p: Problem, features, s: DotSchedule) -> bool:
    """Whether the integer GEMV computes `p` (and so quantizes its rows itself)."""
    return (p.m <= GEMV_MAX_ROWS and not p.w_per_row and p.batch == 1
            and p.row_norm is None and int_plan(p, p.m, features, s) is not None)


def _q8_apart(p: Problem, sig, declare) -> KernelProgram:
    """A thread per block of 32 of a row writes the block as the contraction reads it,
    q8_round's f32(QuantizeI8(x, d)) * d with d = max|x| / 127 (op for op, so the values
    are the oracle's), to scratch [M, K]; then `p`'s contraction of those rows."""
    count, blocks = p.m * p.k, p.m * p.k // Q8_BLOCK
    rounded = BufferParam("q8_rows", DType.F32, Access.READ_WRITE, count, SCRATCH)
    grid, flat = ix.launch_1d(blocks, THREADS)
    kb = sig.builder(grid, (THREADS,), "_q8")
    sig.declare_input(kb, 0)
    kb.buffer(rounded.name, DType.F32, Access.WRITE, count, SCRATCH)
    i = kb.let("i", flat)
    with kb.if_(ix.lt(i, i32(blocks))):
        per_row = p.k // Q8_BLOCK
        m, k0 = kb.let("m", ix.div(i, per_row)), kb.let("k0", ix.mul(ix.mod(i, per_row),
                                                                       Q8_BLOCK))
        xs = [kb.let("x", p.a(i32(0), m, ix.add(k0, j))) for j in range(Q8_BLOCK)]
        amax = maximum(xs[0], -xs[0])
        for x in xs[1:]:
            amax = maximum(amax, maximum(x, -x))
        d = kb.let("d", amax / f32(float(Q8_MAX)))
        at = kb.let("at", ix.add(ix.mul(m, p.k), k0))
        for j, x in enumerate(xs):
            kb.store(rounded.name, ix.add(at, j),
                     quantize_i8(x, d, kb.let).cast(DType.F32) * d)
    first = kb.finish()
    rest = contraction_program(
        replace(p, q8=False, a=Rows(rounded.name, p.k)), sig, _reading(declare, rounded),
        _reading(lambda kb: sig.declare_inputs(kb, p.views), rounded))
    return KernelProgram((first, *rest.kernels), scratch=(rounded, *rest.scratch))


def _norm_inside(p: Problem, s: DotSchedule) -> bool:
    """Whether one GEMV kernel computes `p`, so it can take each row's sum of squares
    (`s.norm_prologue`): the 16-bit GEMV (a group walks all of K) and the integer GEMV
    with K not split (its workgroups quantize whole rows) on the way, the other GEMVs by
    a walk of the workgroup's own over the rows (`gemv.row_roots`)."""
    return s.norm_prologue and p.m <= GEMV_MAX_ROWS and not p.w_per_row and p.batch == 1


def _norm_apart(p: Problem, sig, declare) -> KernelProgram:
    """A kernel of one workgroup per row writes the normed rows to scratch [M, K] (as
    poot.ops.rms_norm computes them), then `p`'s contraction reads them."""
    from poot.codegen.lower.reduce import row_reduce

    norm, count = p.row_norm, p.m * p.k
    normed = BufferParam("normed", DType.F32, Access.READ_WRITE, count, SCRATCH)
    wg = ix.pow2_at_least(p.k, hi=256)
    grid, row = ix.launch_groups(p.m)
    kb = sig.builder(grid, (wg,), "_norm")
    sig.declare_input(kb, 0)
    sig.declare_input(kb, norm.g_operand)
    kb.buffer(normed.name, DType.F32, Access.WRITE, count, SCRATCH)
    m = kb.let("row", row)
    with kb.if_(ix.lt(m, i32(p.m))):   # whole workgroups in or out: uniform
        ss = row_reduce(kb, ReduceOp.Sum, p.k, wg,
                        lambda j: norm.x(i32(0), m, j) * norm.x(i32(0), m, j), DType.F32)
        den = kb.let("den", norm.den(ss, p.k))
        with kb.for_("j", local_index(), p.k, wg) as j:
            kb.store(normed.name, ix.add(ix.mul(m, p.k), j), norm.x(i32(0), m, j) / den
                     * norm.g(j))
    first = kb.finish()
    rest = contraction_program(
        replace(p, row_norm=None, a=Rows(normed.name, p.k)), sig, _reading(declare, normed),
        _reading(lambda kb: sig.declare_inputs(kb, p.views), normed))
    return KernelProgram((first, *rest.kernels), scratch=(normed, *rest.scratch))


def _reading(declared: Callable[[KernelBuilder], None], rows: BufferParam):
    """`declared`, then the scratch rows a contraction reads in place of its operand's."""
    def declare_with(kb):
        declared(kb)
        kb.buffer(rows.name, rows.dtype, Access.READ, rows.count, SCRATCH)
    return declare_with


def contraction_kernel(p: Problem, sig, declare: Callable[[KernelBuilder], None]):
    """The schedule for `p`, in kernels named after `sig`'s eqn, using the optional
    statements its target declares (`sig.features`) and its tuning (`sig.dot_schedule`)."""
    kb_factory, s = sig.builder, sig.dot_schedule
    if p.w_per_row or p.m <= GEMV_MAX_ROWS:
        return gemv_kernel(p, kb_factory, declare, sig.features, s)
    if _rows_gemv_takes(p, sig):
        return gemv_kernel(p, kb_factory, declare, sig.features, s, many_rows=True)
    wide = WIDE_LOADS in sig.features
    if wgmma.usable(p, sig.features):
        return wgmma.wgmma_gemm_kernel(p, kb_factory, declare, wide=wide)
    if mma.usable(p, sig.features):
        return mma.mma_gemm_kernel(p, kb_factory, declare, wide=wide)
    split = mma.decode_schedule(p, sig.features)
    if split is not None:
        return mma.mma_gemm_kernel(p, kb_factory, declare, split, split=True, wide=wide)
    return gemm_kernel(p, kb_factory, declare)
