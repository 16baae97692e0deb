"""The dot-product kernels every matmul-like op shares: out[b, m, n] = sum_k a * w.

An op describes its operands as element functions (`Problem`); this module
owns the schedules:

* GEMV (few rows, decode): one 32-thread group per output column n. Its lanes
  stride along K, so each group reads one weight row with coalesced loads;
  all rows m reuse the weight value from registers; one cooperative reduction
  of width 32 (a warp or subgroup) finishes each dot product. Weights of 16
  bits are read as whole U32 words, two values per load (`w_pair`). Packed
  weights are decoded a run of consecutive k at a time (`w_run`, the format's
  `decode_run`): adjacent lanes take adjacent runs, each run's words and scales
  are loaded once, and a scale shared by a part of the run multiplies its sum.
  Where the weight's words lie in K order (`w_chunks`), each group first copies
  the words of its trip's runs to shared memory, consecutive lanes reading
  consecutive words, and the lanes decode their runs from that copy.
* Integer GEMV (packed weights whose runs are integer bytes, `w_int`, on a target that
  declares DOT2): the workgroup first quantizes its activation rows to int16 per block of
  32 in shared memory (scale max|x| / 32767, round to nearest; the block's integer sum
  and exact f32 sum kept), then the GEMV's runs multiply the weight's bytes with them in
  `Dot2` pairs (exact int32 sums) and scale each block's sum once; staged weight
  words of the next trip are loaded into registers while a trip computes (the first
  trip's while the rows are quantized), or, with ASYNC_STAGES > 0 on a target that
  copies asynchronously (COPY_ASYNC), copied straight into up to ASYNC_STAGES shared
  tiles by 16-byte copies (an 8B layer's K = 4096: every word of the workgroup in
  flight from its start, with no registers held for them). 4-bit (8-bit)
  quants are centred on 8 (128) through the integer sum, so the activations' rounding
  meets (u - centre), not u; the rest of the affine offset meets the exact f32 sum.
  Where each workgroup would quantize many activations per column it computes (an 8B
  down projection, K = 14336) or the grid has few workgroups (its K/V projections), K
  splits into parts (`_int_parts`): a first kernel's workgroups each take one part of
  K for their columns and store partial sums to scratch; a second adds the parts and
  applies the store (and epilogue).
* Rows GEMV (a decode batch: up to BATCH_ROWS rows): the GEMV's groups, a few
  columns each, with lanes striding along K one element at a time, so every activation
  load is coalesced across the lanes and serves all the group's columns, and each weight
  element is decoded once for the group's rows: all of them over wide N, a tile of rows
  over narrow N (a workgroup's groups take one column's row tiles in turn; `RowsRule`).
  A group's many dot products finish by one reduce-scatter per 32 of them where the
  target has it (each lane then stores one), else by a butterfly each.
  (The 16x16 tiles below leave such small problems a few workgroups looping over K
  through barriers: latency-bound.)
* Tiled GEMM (many rows, prefill): 16x16 output tiles, operands staged through
  shared memory tiles of 16 along K (widened to the accumulator type).
* Tensor cores (`poot.codegen.lower.mma`), on targets with a matrix unit, ahead of the
  two above: 16-bit operands as they lie from 64 rows; F32 activations with packed or
  16-bit weights split into bf16 parts past BATCH_ROWS rows, and over a head's wide N
  from 16 rows (`mma.decode_schedule`). On targets with the warpgroup GEMM such
  operands are instead written once as bf16 planes that it multiplies
  (`poot.codegen.lower.planes`), from 64 rows.

Weights that differ per row (IndexedMatMul, MoE) take the GEMV schedule with
one group per output element.

A gated contraction (`Problem.pair`: GatedContraction, a SwiGLU over a stacked gate|up
result) takes the GEMV with its column slots 2i and 2i + 1 given columns i and N/2 + i,
so each workgroup holds whole pairs and joins them after its reductions (`_join_pairs`);
where the GEMV does not apply, the contraction writes [M, N] and a kernel joins the pairs.

The GEMV and integer GEMV load their first trip's weights before the kernel's AwaitInputs
(`EARLY_LOADS`; the integer GEMV where its words are staged or K is one trip), so on a
target whose launches overlap, that latency hides under the kernel before; the runtime
overlaps such a launch only where those operands are plan constants. The rows GEMV does
not (at 32 rows it made the step slower: docs/performance.md).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

from poot.codegen import index as ix
from poot.codegen.builder import KernelBuilder
from poot.codegen.expr import Const, Dot2, Expr, Load, Sel, Un, f32, ge, i32, maximum, u32
from poot.codegen.lower import mma, planes, wgmma
from poot.codegen.program import (
    SCRATCH,
    Access,
    BufferParam,
    KernelProgram,
    group_id,
    local_id,
    local_index,
)
from poot.codegen.target import COPY_ASYNC, DOT2, REDUCE_SCATTER, WIDE_LOADS
from poot.dtypes import DType
from poot.ir.ops import ReduceOp, UnaryOp

LANES = 32        # threads that share one dot product in the GEMV schedule
GROUPS = 8        # dot products per workgroup in the GEMV schedule
TILE = 16         # GEMM tile edge
GEMV_MAX_ROWS = 4
BATCH_ROWS = 32   # the most rows the rows GEMV serves (decode batches)
ROWS_WIDE_N = 8192   # columns from which the rows GEMV takes ROWS_WIDE_COLUMNS a group
ROWS_WIDE_COLUMNS = 2   # columns per group of the rows GEMV over wide N
ROWS_GROUPS = 4   # groups per workgroup in the rows GEMV (more workgroups for small N)
ROWS_UNROLL = 18  # most elements a lane loads per trip in the rows GEMV over narrow N
UNROLL = 4        # strided items per lane per loop trip in the GEMV schedule
RUN_TRIP = 64     # weight elements per lane per trip when decoding runs (>= 32 bytes of 4-bit)
RUN_COLUMNS = 2   # weight rows per group when decoding runs over staged activations
SHARED_BYTES = 16 * 1024   # staged activations and weights stay within this (WebGPU: 16 KiB+)
MIN_SPAN = 16     # fewest activations per run and phase when weights are staged too
#: dot-product warps a 16-bit GEMV wants in flight before it splits rows (fewer left an
#: 8B step's q|k|v, O and down GEMVs under one wave: docs/performance.md, 2026-12-06)
SPLIT_WARPS = 16384
#: 1: a 16-bit GEMV reads its weight 16 bytes a lane and load where the target has
#: WIDE_LOADS (0: one word a load; 1 timed slower on an H200, its activation loads being
#: strided: docs/performance.md, 2026-12-06)
WIDE_WORDS = 0
INT_BLOCK = 32       # activations per int16 scale in the integer GEMV
INT_SHARED_BYTES = 48 * 1024   # a DOT2 target's workgroup shared memory (target.DOT2)
INT_PAD = 32         # quantized activation words per pad word (lanes a run apart: no conflict)
INT_EACH = 8         # activations each thread quantizes (a block's 4 threads reduce together)
INT_WIDE_N = 4096    # columns from which the integer GEMV takes RUN_COLUMNS a group
INT_MAX_K = 1 << 20  # rows from this long keep the f32 schedule (none; 0: every one)
INT_COLUMN_K = 512   # activations a workgroup may quantize per column before K splits
INT_MIN_GROUPS = 256   # workgroups of an integer GEMV below which K splits
INT_PART_K = 2048    # shortest part of a split K (one staged trip of 32-element blocks)
INT_MAX_PARTS = 8    # most parts K splits into
EARLY_LOADS = 1      # 1: GEMVs load their first trip's weights before AwaitInputs (0: after)
#: integer GEMV weight tiles in flight by async copies (0: via registers; 2 made the
#: current 8B Q4_0 step slower: docs/performance.md, 2026-12-06)
ASYNC_STAGES = 0
#: 1: an integer GEMV whose weight chunks are whole 16-byte spans (Q4_K's 144-byte block)
#: reads its staged tile four words a load (WIDE_LOADS), the tile unpadded (four words
#: apart per lane, eight lanes a phase: distinct banks), which also lets async copies
#: fill it; 0: one word a load from a tile padded against bank conflicts (1 timed faster
#: in the 8B Q4_K step: docs/performance.md, 2026-12-06)
QUADS = 1
#: 1: an RMSNorm read by a 16-bit GEMV, or an integer GEMV of one kernel, is taken inside
#: it (its rows' sums of squares with the activations it reads); 0: the norm is always a
#: kernel of its own
NORM_PROLOGUE = 1
#: 1: a 16-bit GEMV reads each weight word's two activations (and norm weights) in one
#: 8-byte load where the target has WIDE_LOADS (0: two 4-byte loads)
PAIRS = 1
#: 1.5 * 2^23: y + MAGIC holds round-to-nearest(y) in its low mantissa bits for |y| < 2^22
MAGIC, MAGIC_BITS = 12582912.0, 0x4B400000

Elem = Callable[..., Expr]


@dataclass(frozen=True)
class Rows:
    """Activations that are the rows of an F32 buffer: a(b, m, k) = buffer[m * K + k]
    (one batch), so an even k and the next are one aligned 8-byte load (`_Activations`)."""

    buffer: str
    k: int

    def at(self, m: Expr, k: Expr) -> Expr:
        return ix.add(ix.mul(m, self.k), k)

    def __call__(self, b, m: Expr, k: Expr) -> Expr:
        return Load(self.buffer, self.at(m, k), DType.F32)


@dataclass(frozen=True)
class RowNorm:
    """An RMSNorm of the activation rows (NormedPackedContraction, NormedDenseContraction):
    the problem's `a(b, m, k)` is x * g, and each product of row m is divided by
    sqrt(sum_k x^2 / K + eps). x is operand 0's rows, g [K] operand `g_operand`."""

    x: Rows
    eps: float
    g_operand: int = 1

    @property
    def g_rows(self) -> Rows:
        return Rows(f"in{self.g_operand}", 0)

    def g(self, k: Expr) -> Expr:
        return self.g_rows(0, i32(0), k)

    def a(self, b, m: Expr, k: Expr) -> Expr:
        """The contraction's activation x * g (the products divide by `den` after)."""
        return self.x(b, m, k) * self.g(k)

    def den(self, ss: Expr, k: int) -> Expr:
        """sqrt(ss / K + eps), as poot.ops.rms_norm rounds it (ss times 1/K)."""
        return Un(UnaryOp.Sqrt, ss * f32(1.0 / k) + f32(self.eps))


@dataclass
class Problem:
    """One contraction. Indices are I32 expressions; element functions return `acc` dtype.

    a(b, m, k); w(b, m, n, k) (m matters only when `w_per_row`);
    w_pair(b, n, kw, load=None) -> (w[2kw], w[2kw+1]) when the weight is read two per word
    (K even); `load(buffer, word)` replaces the word's load if given;
    w_run(b, m, n, k0, load=None) -> [RunPart]: w[k0 : k0 + run] (k0 a multiple of `run`),
    see poot.formats.RunPart; `load(role, word)` replaces the weight's word loads if given;
    w_chunks: role -> (buffer, elements, words) when every role w_run reads lies in K order
    (poot.formats.word_chunks): w_run(b, m, 0, k0, load) then decodes from `load`'s copy of
    the words of row n from k = kc on (kc a multiple of `elements`), k0 counted from kc;
    w_int(b, n, k0, load=None): the same run as poot.formats.IntGroups, None if it has none;
    a_pair(b, m, kw) likewise for the activation; store(kb, b, m, n, acc) writes one result.
    row_norm: the rows are normed first (`RowNorm`; `contraction_program` handles it).
    pair(kb, m, i, lo, hi): a gated contraction's (GatedContraction) store of output i of
    row m from columns i and N/2 + i, in place of `store` (`contraction_program`).
    """

    batch: int
    m: int
    n: int
    k: int
    a: Elem
    w: Elem
    store: Callable[[KernelBuilder, Expr, Expr, Expr, Expr], None]
    acc: DType = DType.F32
    w_per_row: bool = False
    w_pair: Elem | None = None
    views: dict | None = None     # operand index -> (dtype, count) its buffer is read as
    w_run: Elem | None = None
    run: int = 1                  # elements per w_run
    tiles: object = None          # mma_operands.Tiles: 16-bit operands tensor cores can read as is
    w_chunks: dict = field(default_factory=dict)
    w_int: Elem | None = None     # w_int(b, n, k0, load=None) -> [IntGroup] | None, like w_run
    parts: int = 1                # > 1: b is a part of a row parts * k long (`_k_parts`)
    row_norm: RowNorm | None = None
    pair: Callable | None = None

    def zero(self) -> Const:
        return Const(0.0 if self.acc.is_float else 0, self.acc)


#: op class -> problem(sig, store) -> Problem; ops whose kernels are contractions
PROBLEMS: dict[type, Callable] = {}


def problem_for(*op_types: type):
    """Register how an op states its contraction; it lowers through the shared schedules."""
    from poot.codegen.lower.base import lowers

    def deco(fn):
        for t in op_types:
            PROBLEMS[t] = fn
        lowers(*op_types)(lower_contraction)
        return fn
    return deco


def lower_contraction(sig):
    p = PROBLEMS[type(sig.op)](sig, None)
    return contraction_program(p, sig, lambda kb: sig.declare_all(kb, p.views))


def contraction_program(p: Problem, sig, declare: Callable[[KernelBuilder], None],
                        inputs: Callable[[KernelBuilder], None] | None = None):
    """The kernels of `p`: its schedule's one, or a split integer GEMV's two (`_int_parts`):
    the parts' partial sums go to scratch [parts, M, N], then one thread per output adds
    them in part order and stores through `p.store`. A problem with a row norm takes it
    in the integer GEMV where that is one kernel (`_norm_inside`), else runs it first.
    Where the bf16 planes apply (`planes.usable`), their three kernels. `declare`
    declares a kernel's buffers, `inputs` only those it reads (default: the eqn's
    operands)."""
    parts = _int_parts(p, sig.features)
    if p.pair is not None and (parts > 1 or p.row_norm is not None or p.batch != 1
                               or p.w_per_row or p.m > GEMV_MAX_ROWS
                               or _gemv_slots(p, sig.features) % 2):
        return _pair_apart(p, sig, declare, inputs)
    if p.row_norm is not None and not (parts == 1 and _norm_inside(p, sig.features)):
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

    first = gemv_kernel(_k_parts(p, parts, store_part), sig.builder, declare_first,
                        features=sig.features)
    grid, flat = ix.launch_1d(count, LANES * GROUPS)
    kb = sig.builder(grid, (LANES * GROUPS,), "_parts")
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


def _gemv_plan(p: Problem, many_rows: bool, features) -> tuple[RunPlan, int]:
    """`gemv_kernel`'s plan for `p` and the warps a dot product takes."""
    rows = p.m if not p.w_per_row else 1
    if many_rows:
        rule = ROWS_SCATTERED if REDUCE_SCATTER in features else ROWS_FOLDED
        plan = _rows_plan(p, rule)
    else:
        plan = _int_plan(p, rows, features) or _run_plan(p, rows)
    columns = p.batch * p.n * (p.m if p.w_per_row else 1)
    return plan, _words_split(p, columns) if _words(p, many_rows) else plan.split


def _gemv_slots(p: Problem, features) -> int:
    """Columns one workgroup of `gemv_kernel` computes."""
    plan, split = _gemv_plan(p, False, features)
    return plan.width * plan.groups // split


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
    grid, flat = ix.launch_1d(outputs, LANES * GROUPS)
    kb = sig.builder(grid, (LANES * GROUPS,), "_gate")
    declare(kb)
    kb.buffer(both.name, p.acc, Access.READ, count, SCRATCH)
    o = kb.let("o", flat)
    with kb.if_(ix.lt(o, i32(outputs))):
        row, i = kb.let("row", ix.div(o, half)), kb.let("i", ix.mod(o, half))
        at = kb.let("at", ix.add(ix.mul(row, p.n), i))
        p.pair(kb, row, i, kb.let("lo", Load(both.name, at, p.acc)),
               kb.let("hi", Load(both.name, ix.add(at, half), p.acc)))
    return KernelProgram((*first.kernels, kb.finish()), scratch=(*first.scratch, both))


def _norm_inside(p: Problem, features) -> bool:
    """Whether one GEMV kernel computes `p` and sees whole rows of the activation, so it
    can take each row's sum of squares on the way: the 16-bit GEMV (a group walks all of
    K), or the integer GEMV with K not split (its workgroups quantize whole rows)."""
    return (bool(NORM_PROLOGUE) and p.m <= GEMV_MAX_ROWS and not p.w_per_row
            and p.batch == 1 and (_words(p) or _int_plan(p, p.m, features) is not None))


def _words(p: Problem, many_rows: bool = False) -> bool:
    """Whether the GEMV reads `p`'s weight as 16-bit pairs, a U32 word at a time."""
    return not many_rows and p.w_pair is not None and not p.w_per_row and p.k % 2 == 0


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

    def reading(declared):
        def declare_with(kb):
            declared(kb)
            kb.buffer(normed.name, DType.F32, Access.READ, count, SCRATCH)
        return declare_with
    rest = contraction_program(
        replace(p, row_norm=None, a=Rows(normed.name, p.k)),
        sig, reading(declare), reading(lambda kb: sig.declare_inputs(kb, p.views)))
    return KernelProgram((first, *rest.kernels), scratch=(normed, *rest.scratch))


def _k_parts(p: Problem, parts: int, store) -> Problem:
    """`p` (batch 1) as `parts` problems over consecutive parts of K, the part as batch b:
    element k of part b is element b * K / parts + k of the row. A staged copy of the
    weight's words (`load` given) is decoded at k0 within its trip, as before."""
    k = p.k // parts

    def at(b, kk):
        return ix.add(ix.mul(b, k), kk)

    def w_int(b, n, k0, load=None):
        return p.w_int(0, n, k0 if load is not None else at(b, k0), load)

    def w_run(b, m, n, k0, load=None):
        return p.w_run(0, m, n, k0 if load is not None else at(b, k0), load)

    return replace(p, batch=parts, k=k, parts=parts, store=store,
                   a=lambda b, m, kk: p.a(0, m, at(b, kk)),
                   w=lambda b, m, n, kk: p.w(0, m, n, at(b, kk)),
                   w_run=w_run if p.w_run is not None else None, w_int=w_int)


def _int_parts(p: Problem, features) -> int:
    """Parts K splits into for the integer GEMV (1: none). It splits where a workgroup
    would quantize more than INT_COLUMN_K activations per column it computes, or the grid
    would have fewer than INT_MIN_GROUPS workgroups: into the fewest parts, at least
    INT_PART_K long, that fix that (else the most there are), keep a staged weight tile
    where the whole row had one and keep three quarters of a warp's lanes on runs."""
    if p.m > GEMV_MAX_ROWS or p.w_per_row or p.batch > 1:
        return 1
    plan = _int_plan(p, p.m, features)
    if plan is None or not _int_wants_split(p, plan):
        return 1
    best = 1
    for parts in range(2, INT_MAX_PARTS + 1):
        k = p.k // parts
        if (p.k % parts or k < INT_PART_K or k % p.run or 4 * (k // p.run) < 3 * LANES
                or any(k % e for _, e, _ in p.w_chunks.values())):
            continue
        q = _k_parts(p, parts, p.store)
        sub = _int_plan(q, q.m, features)
        if (sub is None or (plan.words is not None and sub.words is None)
                or p.n % (sub.width * sub.groups)):
            continue        # a workgroup's columns must lie in one part (shared activations)
        best = parts
        if not _int_wants_split(q, sub):
            break
    return best


def _int_wants_split(p: Problem, plan: RunPlan) -> bool:
    columns = plan.width * plan.groups
    return p.k > columns * INT_COLUMN_K or p.batch * -(-p.n // columns) < INT_MIN_GROUPS


def contraction_kernel(p: Problem, sig, declare: Callable[[KernelBuilder], None]):
    """The schedule for `p`, in kernels named after `sig`'s eqn, using the optional
    statements its target declares (`sig.features`)."""
    kb_factory = sig.builder
    if p.w_per_row or p.m <= GEMV_MAX_ROWS:
        return gemv_kernel(p, kb_factory, declare, features=sig.features)
    wide = WIDE_LOADS in sig.features
    if wgmma.usable(p, sig.features):
        return wgmma.wgmma_gemm_kernel(p, kb_factory, declare, wide=wide)
    if mma.usable(p, sig.features):
        return mma.mma_gemm_kernel(p, kb_factory, declare, wide=wide)
    split = mma.decode_schedule(p, sig.features)
    if split is not None:
        return mma.mma_gemm_kernel(p, kb_factory, declare, split, split=True, wide=wide)
    if p.m <= BATCH_ROWS:
        return gemv_kernel(p, kb_factory, declare, many_rows=True, features=sig.features)
    return gemm_kernel(p, kb_factory, declare)


def gemv_kernel(p: Problem, kb_factory, declare, many_rows: bool = False,
                features: frozenset = frozenset()):
    """The GEMV schedules; `many_rows`: the rows GEMV (element walk, several columns);
    `features`: the target's (the integer GEMV where it declares DOT2)."""
    rows = p.m if not p.w_per_row else 1        # rows sharing one weight column per group
    columns = p.batch * p.n * (p.m if p.w_per_row else 1)
    scatter = many_rows and REDUCE_SCATTER in features
    plan, split = _gemv_plan(p, many_rows, features)
    width = plan.width                          # columns per group
    tile = min(plan.rows or rows, rows)         # rows per group
    chunks = -(-rows // tile)                   # groups sharing one set of columns
    words = _words(p, many_rows)
    lanes, groups = LANES * split, plan.groups // split    # threads per dot product
    grid, blk = ix.launch_groups(-(-(-(-columns // width) * chunks) // groups))
    kb = kb_factory(grid, (LANES * plan.groups,))
    declare(kb)
    lane = kb.let("lane", ix.mod(local_index(), lanes))
    group = kb.let("col", ix.add(ix.mul(blk, groups), ix.div(local_index(), lanes)))
    if chunks > 1:      # a workgroup's groups take one set of columns' row tiles in turn
        chunk = kb.let("rt", ix.mod(group, chunks))
        group = kb.let("col", ix.div(group, chunks))
    cols = [group if width == 1 else kb.let("col", ix.add(ix.mul(group, width), t))
            for t in range(width)]
    # every group runs the loop (its reduction must be uniform); spare ones use the last column
    cs = [kb.let("c", ix.minimum(col, i32(columns - 1))) for col in cols]
    # a gated contraction's column pairs (i, N/2 + i) lie side by side: 2i and 2i + 1
    ns = [kb.let("n", ix.mod(c, p.n) if p.pair is None else
                 ix.add(ix.div(c, 2), ix.mul(ix.mod(c, 2), p.n // 2))) for c in cs]
    rest = kb.let("rest", ix.div(cs[0], p.n))   # one batch per group (width > 1: batch 1)
    if p.w_per_row:
        ms = [kb.let("m", ix.mod(rest, p.m))]
        b = kb.let("b", ix.div(rest, p.m))
    elif chunks > 1:    # the last tile's spare rows repeat row M - 1 and store nothing
        first = kb.let("m0", ix.mul(chunk, tile))
        ms = [kb.let("m", ix.minimum(ix.add(first, j), i32(rows - 1))) for j in range(tile)]
        b = rest
    else:
        ms = [i32(m) for m in range(rows)]
        b = rest
    accs = [[kb.var(f"acc{j}", p.zero()) for j in range(len(ms))] for _ in ns]
    dens = None       # a row norm's root per row, which every product divides by
    if many_rows:
        _gemv_columns(kb, p, lane, b, ns, ms, accs, plan.unroll, lanes)
    elif words:
        wide = bool(WIDE_WORDS) and WIDE_LOADS in features and p.k % 8 == 0
        pairs = bool(PAIRS) and WIDE_LOADS in features
        dens = (_gemv_units if wide else _gemv_words)(kb, p, lane, b, ns[0], ms, accs[0],
                                                      lanes, pairs)
    elif plan.integer:
        dens = _gemv_int(kb, p, plan, lane, b, ns, ms, accs)
    elif p.w_run is not None and p.run > 1:
        _gemv_runs(kb, p, plan, lane, b, ns, ms, accs)
    else:
        _gemv_elements(kb, p, lane, b, ns[0], ms, accs[0], 0)
    if scatter:
        flat = [accs[t][j] for j in range(len(ms)) for t in range(len(cols))]
        for i, total, holds in _scattered_sums(kb, p, flat, lanes, plan.groups):
            t, j = ix.mod(i, len(cols)), ix.div(i, len(cols))
            col = kb.let("col", ix.add(ix.mul(group, len(cols)), t)) if len(cols) > 1 \
                else group
            m = ix.add(first, j) if chunks > 1 else j
            ok = ix.both(holds, ix.both(ix.lt(col, i32(columns)), ix.lt(m, i32(rows))))
            with kb.if_(ok):
                p.store(kb, b, kb.let("m", m), kb.let("n", ix.mod(col, p.n)), total)
        return kb.finish()
    totals = _split_sums(kb, p, accs, lanes, plan.groups) if many_rows and lanes > LANES \
        else [[kb.reduce("dot", ReduceOp.Sum, acc, lanes) for acc in column] for column in accs]
    if p.pair is not None:
        _join_pairs(kb, p, blk, groups * width, lane, cols, totals, dens, LANES * plan.groups)
        return kb.finish()
    for col, n, sums in zip(cols, ns, totals, strict=True):
        with kb.if_(ix.both(ix.eq(lane, i32(0)), ix.lt(col, i32(columns)))):
            for j, (total, m) in enumerate(zip(sums, ms, strict=True)):
                if dens is not None:
                    total = total / dens[j]
                if chunks * tile > rows and j:
                    with kb.if_(ix.lt(ix.add(first, j), i32(rows))):
                        p.store(kb, b, m, n, total)
                else:
                    p.store(kb, b, m, n, total)
    return kb.finish()


def _join_pairs(kb, p: Problem, blk, slots: int, lane, cols, totals, dens, threads: int):
    """A gated contraction's outputs: the workgroup's `slots` columns (2i, 2i + 1: the
    pairs i, N/2 + i) meet in shared memory, then one thread per output joins a pair."""
    rows = p.m
    sums = kb.shared("pair_sums", p.acc, slots * rows)
    first = kb.let("s0", ix.mul(blk, slots))
    for col, column in zip(cols, totals, strict=True):
        with kb.if_(ix.both(ix.eq(lane, i32(0)), ix.lt(col, i32(p.n)))):
            slot = ix.sub(col, first)
            for j, total in enumerate(column):
                value = total if dens is None else total / dens[j]
                kb.store(sums, ix.add(ix.mul(slot, rows), j), value)
    kb.barrier()
    with kb.for_("e", local_index(), slots // 2 * rows, threads) as e:
        pair, m = kb.let("pr", ix.div(e, rows)), kb.let("m", ix.mod(e, rows))
        i = kb.let("i", ix.add(ix.div(first, 2), pair))
        with kb.if_(ix.lt(i, i32(p.n // 2))):
            at = ix.add(ix.mul(pair, 2 * rows), m)
            p.pair(kb, m, i, kb.let("lo", sums[at]), kb.let("hi", sums[ix.add(at, rows)]))


def _split_sums(kb, p: Problem, accs, lanes: int, warps: int):
    """The dot products of groups of several warps (`warps` in the workgroup): each warp's
    sums (shuffles), stored to shared memory, one barrier, then each group's warps'
    partials added in order (a cooperative reduction wider than a warp would take two
    barriers for every one)."""
    flat = [acc for column in accs for acc in column]
    parts = [kb.reduce("dot", ReduceOp.Sum, acc, LANES) for acc in flat]
    scratch = kb.shared("dot_parts", p.acc, warps * len(flat))
    warp = kb.let("warp", ix.div(local_index(), LANES))
    with kb.if_(ix.eq(ix.mod(local_index(), LANES), i32(0))):
        for i, part in enumerate(parts):
            kb.store(scratch, ix.add(ix.mul(warp, len(flat)), i), part)
    kb.barrier()
    first = kb.let("w0", ix.mul(ix.div(local_index(), lanes), lanes // LANES * len(flat)))
    totals = []
    for i in range(len(flat)):
        total = scratch[ix.add(first, i)]
        for w in range(1, lanes // LANES):
            total = total + scratch[ix.add(first, w * len(flat) + i)]
        totals.append(kb.let("dot", total))
    per = len(flat) // len(accs)
    return [totals[t * per:(t + 1) * per] for t in range(len(accs))]


def _scattered_sums(kb, p: Problem, flat: list, lanes: int, warps: int):
    """The dot products `flat` of groups of `lanes` threads (`warps` warps a workgroup),
    LANES at a time by reduce-scatter: yields (i, total, holds) per set, where this thread
    holds flat[i]'s total when `holds` (one thread per product). A group of several warps
    meets in shared memory: each warp's holders store their sums, one barrier, then the
    first warp's holders add the group's partials in order."""
    wl = kb.let("wl", ix.mod(local_index(), LANES))
    sets = [flat[c:c + LANES] for c in range(0, len(flat), LANES)]
    widths = [1 << (len(x) - 1).bit_length() for x in sets]     # padded to powers of two
    parts = [kb.reduce_scatter("dot", ReduceOp.Sum, x + [p.zero()] * (v - len(x)), LANES)
             for x, v in zip(sets, widths, strict=True)]
    places = []                              # (index within the set, holds) per set
    for v in widths:
        rep = LANES // v                     # threads holding each product
        places.append((kb.let("di", ix.div(wl, rep)), ix.eq(ix.mod(wl, rep), i32(0))))
    offsets = [sum(widths[:c]) for c in range(len(widths))]
    if lanes > LANES:
        per, split = sum(widths), lanes // LANES
        scratch = kb.shared("dot_parts", p.acc, warps * per)
        warp = kb.let("warp", ix.div(local_index(), LANES))
        for (li, holds), part, off in zip(places, parts, offsets, strict=True):
            with kb.if_(holds):
                kb.store(scratch, ix.add(ix.mul(warp, per), ix.add(li, off)), part)
        kb.barrier()
        w0 = kb.let("w0", ix.mul(ix.div(local_index(), lanes), split))
        first = ix.lt(ix.mod(local_index(), lanes), i32(LANES))
        for c, ((li, holds), off) in enumerate(zip(places, offsets, strict=True)):
            at = kb.let("at", ix.add(ix.mul(w0, per), ix.add(li, off)))
            total = scratch[at]
            for w in range(1, split):
                total = total + scratch[ix.add(at, w * per)]
            places[c] = (li, ix.both(holds, first))
            parts[c] = kb.let("dot", total)
    for c, ((li, holds), part) in enumerate(zip(places, parts, strict=True)):
        i = kb.let("di", ix.add(li, c * LANES))
        yield i, part, ix.both(holds, ix.lt(i, i32(len(flat))))


def _words_split(p: Problem, columns: int) -> int:
    """Warps per dot product of a 16-bit GEMV (a power of two, at most GROUPS): with one
    warp per column, few columns leave too few loads in flight to fill the memory pipe
    (the K and V projections of an 8B model, 1024 columns: 45% of copy bandwidth on an
    H200), so each column's K is split across warps while there are fewer than
    SPLIT_WARPS warps and every lane keeps at least 2 * UNROLL words."""
    words, split = p.k // 2, 1
    while (split < GROUPS and columns * split < SPLIT_WARPS
           and words >= LANES * 2 * split * 2 * UNROLL):
        split *= 2
    return split


@dataclass(frozen=True)
class RunPlan:
    """How the GEMV walks runs: `width` columns per group, `groups` groups per workgroup,
    `span` elements of each run's activations per staging phase (None: activations read
    where they are), `words` role -> words per column and trip of staged weights (None:
    each lane loads its runs' words). The rows GEMV uses `width`, `groups` and `unroll`
    (elements per lane and trip); `integer`: the integer GEMV (`_int_plan`)."""

    width: int = 1
    groups: int = GROUPS
    span: int | None = None
    words: dict | None = None
    unroll: int = UNROLL
    integer: bool = False
    rows: int | None = None       # rows per group (None: all)
    split: int = 1                # warps per group (the rows GEMV's K split over them)
    stages: int = 0               # staged weight tiles filled by async copies (0: registers)
    quads: bool = False           # the staged tile read four words a load (QUADS)


def _run_plan(p: Problem, rows: int) -> RunPlan:
    """Staged weights where the format lays its words out in K order: a lane's run of 4-bit
    Q4_0 is 9 words, so lanes loading their own runs read words 36 bytes apart per load
    and 9 loads re-touch the same sectors (load/store-bound at 45% of copy bandwidth on an
    H200); copied by the group, consecutive lanes read consecutive words. Their tile and
    the activation tile share SHARED_BYTES: RUN_COLUMNS columns per group if they fit
    (fewer shared loads of activations per weight), then the most groups per workgroup
    (at least 4 columns, so each staged activation serves several). Else activations
    alone are staged with RUN_COLUMNS columns per group (each activation a lane reads from
    the tile then serves that many weight rows: one shared load per element was a fifth of
    a 4-bit weight's instructions)."""
    if (p.w_run is None or p.run <= 1 or (p.w_pair is not None and p.k % 2 == 0)
            or p.w_per_row or p.batch > 1):    # nothing shared across the workgroup
        return RunPlan()
    per = LANES * _run_unroll(p)
    # Rows shorter than one whole trip (SmolLM2's 576 and 1536) are latency-bound: the
    # staging's barrier and shared round trip cost more than coalescing gains there.
    words = _trip_words(p, per) if p.k >= per * p.run else None
    options = [(w, g) for w in (RUN_COLUMNS, 1) for g in (GROUPS, GROUPS // 2, GROUPS // 4)
               if w * g >= GROUPS // 2] if words else []
    for width, groups in options:
        span = _stage_span(p, rows, per, groups,
                           SHARED_BYTES - 4 * groups * width * _pitch(words))
        if span is not None and span >= min(MIN_SPAN, p.run):
            return RunPlan(width, groups, span, words)
    span = _stage_span(p, rows, per, GROUPS, SHARED_BYTES)
    return RunPlan(RUN_COLUMNS, GROUPS, span) if span is not None else RunPlan()


def _int_plan(p: Problem, rows: int, features) -> RunPlan | None:
    """The integer GEMV where the target declares DOT2 and the weight's runs are whole
    integer groups of 32 (None otherwise: the f32 schedules, e.g. Q5_x, Q2_K, Q3_K, Q6_K,
    IQ4_NL, MXFP4 and every non-GGUF format): its quantized activations and, where the
    weight's words lie in K order over whole trips, a weight tile of the staged schedule
    (`_weight_tile`) within INT_SHARED_BYTES; else each lane loads its runs' words."""
    # every K takes it (INT_MAX_K): the shapes where it loses are in docs/performance.md
    if (DOT2 not in features or p.w_int is None or p.w_per_row or p.batch != p.parts
            or p.run % INT_BLOCK or p.k % p.run or p.k >= INT_MAX_K):
        return None
    if p.w_int(0, i32(0), i32(0)) is None:
        return None
    act = 4 * rows * (_int_row_words(p.k) + 3 * (p.k // INT_BLOCK))
    if act > INT_SHARED_BYTES:
        return None
    width = RUN_COLUMNS if p.n >= INT_WIDE_N else 1
    per = LANES * _run_unroll(p)
    quads = bool(QUADS) and WIDE_LOADS in features and _quad_chunks(p)
    words = _trip_words(p, per, quads) if p.k % (per * p.run) == 0 else None
    # the most threads first: they share the quantization of the rows
    options = ((width, GROUPS), (1, GROUPS), (width, GROUPS // 2)) if words else ()
    for cols, groups in options:
        tile = 4 * groups * cols * _pitch(words)
        stages = _async_stages(p, words, p.k // (per * p.run), tile,
                               INT_SHARED_BYTES - act, features, quads)
        if stages or act + tile <= INT_SHARED_BYTES:
            return RunPlan(cols, groups, None, words, integer=True, stages=stages,
                           quads=quads)
    return RunPlan(width, GROUPS, integer=True)


def _async_stages(p: Problem, words: dict, trips: int, tile: int, budget: int,
                  features, quads: bool = False) -> int:
    """Weight tiles an integer GEMV keeps in flight by 16-byte async copies (0: none, the
    words go through registers): up to ASYNC_STAGES trips, where the target copies
    asynchronously, every copy is 16-byte aligned (rows, trips and parts of whole 4-word
    spans, no pad words in the tile) and the tiles fit `budget` bytes; at least two
    unless K is one trip (one tile would leave each later trip's copy unoverlapped)."""
    if (not ASYNC_STAGES or COPY_ASYNC not in features or _chunk_pad(p, quads)
            or any(n % 4 for n in words.values())
            or any(p.k // e * w % 4 for _, e, w in p.w_chunks.values())):
        return 0
    stages = min(trips, ASYNC_STAGES)
    while stages > 1 and stages * tile > budget:
        stages -= 1
    return stages if stages * tile <= budget and (stages > 1 or trips == 1) else 0


def _int_row_words(k: int) -> int:
    """Shared words of one row of int16 activation pairs, pads included."""
    return k // 2 + k // 2 // INT_PAD


@dataclass(frozen=True)
class RowsRule:
    """How the rows GEMV lays out a narrow problem (see `_rows_plan`): `tile` rows a group,
    `columns` columns a group past one tile of rows while that leaves at least
    `min_groups` groups, and K split over up to `split` warps a group while the grid has
    fewer than `warps` warps, each lane keeps `min_trip` elements and the group's
    accumulators times its warps stay within `accs` (a workgroup's registers)."""

    tile: int
    columns: int
    split: int
    warps: int
    min_trip: int
    accs: int = 1 << 30
    min_groups: int = 0


#: targets that finish each dot product by its own butterfly (CoopReduce)
ROWS_FOLDED = RowsRule(tile=8, columns=4, split=4, warps=4096, min_trip=9)
#: targets with REDUCE_SCATTER, whose products cost little to finish, so the best tiles
#: are taller and K splits further (the sweep in docs/performance.md, 2026-12-03)
ROWS_SCATTERED = RowsRule(tile=16, columns=4, split=8, warps=8192, min_trip=2, accs=128,
                          min_groups=128)


def _rows_plan(p: Problem, rule: RowsRule) -> RunPlan:
    """The rows GEMV's columns per group (one batch per group: N a multiple of them), rows
    per group and elements per lane and trip (`unroll`). Narrow problems (few columns, so
    few groups) are bound by each group's chain of trips and have too few warps to hide
    it: `rule.tile` rows a group (a batch's rows over several groups: more warps, each
    with a shorter chain of loads and multiply-adds per element), `rule.columns` columns
    a group past one tile of rows (each activation load serves them all; one tile keeps
    one column, for warps), K split over `split` warps a group (each warp a shorter chain
    again; the warps' sums meet in shared memory), and the most elements per trip that
    divide K's whole lane strides, so short rows (SmolLM2's K = 576) take one trip. Wide
    ones have groups enough to hide latency: every row and ROWS_WIDE_COLUMNS columns a
    group (each activation load serves them all) in trips of UNROLL."""
    wide = p.batch * p.n >= ROWS_WIDE_N
    tiles = -(-p.m // rule.tile)
    many = p.m > rule.tile and p.n // rule.columns * tiles >= rule.min_groups
    width = ROWS_WIDE_COLUMNS if wide else rule.columns if many else 1
    width = width if p.batch == 1 and p.n % width == 0 else 1
    if wide:        # groups enough already: row tiles would only decode each weight again
        return RunPlan(width, ROWS_GROUPS)
    warps = p.batch * p.n // width * tiles
    accs = width * min(p.m, rule.tile)
    split = 1
    while (2 * split <= rule.split and 2 * split * warps <= rule.warps
           and 2 * split * accs <= rule.accs and p.k >= 2 * split * LANES * rule.min_trip):
        split *= 2
    strides = p.k // (LANES * split)
    unroll = max((u for u in range(1, ROWS_UNROLL + 1) if strides % u == 0), default=1)
    return RunPlan(width, ROWS_GROUPS * split, unroll=unroll, rows=rule.tile, split=split)


def _run_unroll(p: Problem) -> int:
    return max(1, RUN_TRIP // p.run)


def _trip_words(p: Problem, per: int, quads: bool = False) -> dict | None:
    """role -> words of one row that a trip of `per` runs reads (its K range, whole chunks
    of every role), or None."""
    span = per * p.run
    if not p.w_chunks or any(span % e or p.k % e for _, e, _ in p.w_chunks.values()):
        return None
    pad = _chunk_pad(p, quads)
    return {role: span // e * (w + pad) for role, (_, e, w) in p.w_chunks.items()}


def _chunk_pad(p: Problem, quads: bool = False) -> int:
    """Tile words after each chunk: 1 where that makes an even chunk odd, so lanes whose
    runs lie in different chunks read the same place of theirs from distinct banks (Q4_K:
    4 runs per 36-word block read 4-way conflicted, 37 words apart none). Only for one role
    whose chunks hold whole runs (a run's words stay contiguous in the tile), and not
    where the tile is read by `quads` (a 36-word pitch keeps them apart)."""
    if len(p.w_chunks) != 1 or quads:
        return 0
    ((_, e, w),) = p.w_chunks.values()
    return 1 if w % 2 == 0 and e % p.run == 0 else 0


def _quad_chunks(p: Problem) -> bool:
    """Whether the weight is one role of chunks of whole runs and whole 16-byte spans, a
    chunk's words 4-aligned wherever the tile puts it (`QUADS`)."""
    if len(p.w_chunks) != 1:
        return False
    ((_, e, w),) = p.w_chunks.values()
    return w % 4 == 0 and e % p.run == 0


def _pitch(words: dict) -> int:
    """Tile words per column and trip (the roles one after another)."""
    return sum(words.values())


def _unrolled(kb, lane, start: int, stop: int, unroll: int = UNROLL, lanes: int = LANES):
    """A lane's strided walk over items start .. stop - 1 (adjacent lanes, adjacent items)
    among `lanes` lanes: yields, per loop trip, the item indices the lane takes. Trips of
    `unroll` items, `lanes` apart, while whole such trips remain (every slot loads before
    any use, so `unroll` coalesced loads are in flight per lane), then trips of one item
    for the rest. Every item yielded is in range: no clamping or masking."""
    stride = lanes * unroll
    full = start + (stop - start) // stride * stride
    if full > start:
        with kb.for_("base", ix.add(lane, start), full, stride) as base:
            yield [ix.add(base, lanes * u) for u in range(unroll)]
    if full < stop:
        with kb.for_("it", ix.add(lane, full), stop, lanes) as it:
            yield [it]


def _gemv_words(kb, p: Problem, lane, b, n, ms, accs, lanes: int = LANES,
                pairs: bool = False):
    """16-bit weights, two per U32 word, over `lanes` lanes per column: each lane reads
    whole words, 8 in flight on long rows (few columns of long rows need more loads in
    flight per lane to fill the memory pipe: N=4096, K=14336 ran at 55% of copy bandwidth
    with 4). `pairs`: a word's two activations in one 8-byte load (`_Activations`)."""
    words_per_row = p.k // 2
    unroll = 2 * UNROLL if words_per_row >= 4 * lanes * 2 * UNROLL else UNROLL
    act = _Activations(kb, p, b, ms, pairs)

    def word(name, at):          # one load a word, both halves read from it
        return kb.let("wd", Load(name, at, DType.U32))

    def load(slots):
        return [tuple(kb.let("w", x) for x in p.w_pair(b, n, kw, load=word)) for kw in slots]

    def use(slots, words):
        for kw, (w0, w1) in zip(slots, words, strict=True):
            k0 = kb.let("k0", ix.mul(kw, 2))
            for j, acc in enumerate(accs):
                a0, a1 = act.pair(j, k0)
                kb.assign(acc, acc + a0 * w0 + a1 * w1)
    _early_walk(kb, lane, words_per_row, unroll, lanes, load, use)
    return act.roots(lanes)


def _gemv_units(kb, p: Problem, lane, b, n, ms, accs, lanes: int = LANES,
                pairs: bool = False):
    """`_gemv_words` 16 bytes at a time: each lane reads units of 4 words (8 values of K)
    in one load, 4 units in flight on long rows, so a warp's load instruction moves 512
    bytes instead of 128."""
    units = p.k // 8
    unroll = 4 if units >= 2 * lanes * 4 else 2 if units >= 2 * lanes else 1

    def first_word(u):
        """(buffer, index) of unit u's first word, as w_pair addresses it."""
        found = []
        p.w_pair(b, n, ix.mul(u, 4), load=lambda name, at: found.append((name, at)) or Load(
            name, at, DType.U32))
        return found[0]

    act = _Activations(kb, p, b, ms, pairs)

    def load(slots):
        return [kb.load_wide("w", *first_word(u), 4) for u in slots]

    def use(slots, held):
        for u, words in zip(slots, held, strict=True):
            for i, word in enumerate(words):
                w0, w1 = (kb.let("w", x) for x in p.w_pair(
                    b, n, ix.add(ix.mul(u, 4), i), load=lambda name, at, word=word: word))
                k0 = kb.let("k0", ix.add(ix.mul(u, 8), 2 * i))
                for j, acc in enumerate(accs):
                    a0, a1 = act.pair(j, k0)
                    kb.assign(acc, acc + a0 * w0 + a1 * w1)
    _early_walk(kb, lane, units, unroll, lanes, load, use)
    return act.roots(lanes)


class _Activations:
    """Activations (row j, k0 and k0 + 1, k0 even) of a GEMV walk: `p.a`'s, or with a row
    norm x * g while this thread's sum of x^2 per row grows (one FMA more an element:
    the norm rides on the loads the GEMV makes anyway); `roots` reduces those sums over
    the group. With `wide` loads, rows (`Rows`) are read a pair at a time."""

    def __init__(self, kb, p: Problem, b, ms, wide: bool = False):
        self.kb, self.p, self.b, self.ms, self.wide = kb, p, b, ms, wide
        self.norm = p.row_norm
        self.ss = None if self.norm is None else [kb.var("ss", f32(0.0)) for _ in ms]

    def _two(self, name: str, rows, m, k0) -> tuple[Expr, Expr]:
        if self.wide and isinstance(rows, Rows):
            return tuple(self.kb.load_wide(name, rows.buffer, rows.at(m, k0), 2))
        return tuple(self.kb.let(name, rows(self.b, m, k)) for k in (k0, ix.add(k0, 1)))

    def pair(self, j: int, k0: Expr) -> tuple[Expr, Expr]:
        m = self.ms[j]
        if self.norm is None:
            if self.wide and isinstance(self.p.a, Rows):
                return self._two("a", self.p.a, m, k0)
            return self.p.a(self.b, m, k0), self.p.a(self.b, m, ix.add(k0, 1))
        xs = self._two("x", self.norm.x, m, k0)
        gs = self._two("g", self.norm.g_rows, i32(0), k0)
        for x in xs:
            self.kb.assign(self.ss[j], self.ss[j] + x * x)
        return tuple(x * g for x, g in zip(xs, gs, strict=True))

    def roots(self, lanes: int) -> list[Expr] | None:
        """Each row's sqrt(sum x^2 / K + eps) over the `lanes` threads of a group."""
        if self.norm is None:
            return None
        return [self.kb.let("den", self.norm.den(
            self.kb.reduce("ss", ReduceOp.Sum, ss, lanes), self.p.k)) for ss in self.ss]


def _early_walk(kb, lane, stop: int, unroll: int, lanes: int, load, use):
    """`_unrolled`'s walk as load(slots) -> held, then use(slots, held), with the first
    whole trip's loads (weights only) issued before the kernel's AwaitInputs, so they
    overlap the kernel before this one (EARLY_LOADS; K shorter than a trip: none)."""
    start = 0
    if EARLY_LOADS and stop >= lanes * unroll:
        first = [ix.add(lane, lanes * u) for u in range(unroll)]
        held = load(first)
        kb.await_inputs()
        use(first, held)
        start = lanes * unroll
    for slots in _unrolled(kb, lane, start, stop, unroll, lanes):
        use(slots, load(slots))


def _gemv_elements(kb, p: Problem, lane, b, n, ms, accs, start: int):
    """One weight element at a time, k = start .. K - 1 (f32, odd K, a packed weight without
    runs or past its last whole run)."""
    for slots in _unrolled(kb, lane, start, p.k):
        shared = None if p.w_per_row else kb.let_shared("w", [p.w(b, ms[0], n, k)
                                                             for k in slots])
        for u, k in enumerate(slots):
            for acc, m in zip(accs, ms, strict=True):
                wk = shared[u] if shared is not None else p.w(b, m, n, k)
                kb.assign(acc, acc + p.a(b, m, k) * wk)


def _gemv_columns(kb, p: Problem, lane, b, ns, ms, accs, unroll: int, lanes: int = LANES):
    """Many rows (accs[t][j]: column t, row j), one weight element of each column at a
    time, `unroll` per lane and trip: the lanes' activations of one row and k are adjacent
    (one coalesced load, bound once for every column), and each weight is decoded once
    (bound) for every row. Packed weights decode element by element here: their runs would
    have each lane read its own span of every row's activations, a line per lane and load.
    `lanes` lanes (a warp or several) share each dot product."""
    for slots in _unrolled(kb, lane, 0, p.k, unroll, lanes):
        ws = iter([kb.let("w", x) for x in kb.let_shared(
            "w", [p.w(b, ms[0], n, k) for n in ns for k in slots])])
        ws = [[next(ws) for _ in slots] for _ in ns]
        for u, k in enumerate(slots):
            for j, m in enumerate(ms):
                a = kb.let("a", p.a(b, m, k)) if len(ns) > 1 else p.a(b, m, k)
                for t, column in enumerate(accs):
                    kb.assign(column[j], column[j] + a * ws[t][u])


def _gemv_runs(kb, p: Problem, plan: RunPlan, lane, b, ns, ms, accs):
    """Packed weights, a run of `p.run` consecutive k per lane and slot, for columns `ns`
    (accs[t][j]: column t, row j): the words and scales of every run in flight are loaded
    once (let_shared binds them first), then each part adds scale * sum(a * value) +
    offset * sum(a) per row, each activation read once for all columns. With an offset and
    several rows it is cheaper to decode w = scale * value + offset once and share it; K
    past the last whole run goes element by element."""
    runs = p.k // p.run
    unroll = _run_unroll(p)
    walk = _direct_trips(kb, p, lane, b, ms, runs, unroll) if plan.span is None else \
        _staged_trips(kb, p, plan, lane, b, ns, ms, runs, unroll)
    for slots, phases, decode in walk:
        decoded = [decode(t, n, k0) for t, n in enumerate(ns) for k0, _ in slots]
        flat = [x for parts in decoded for part in parts
                for x in (*part.values, part.scale, part.offset) if x is not None]
        bound = iter(kb.let_shared("w", flat))
        bound_parts = []        # per column and slot: (first element, values, exponents,
        for parts in decoded:   # scale, offset) per part
            bound_parts.append([])
            k = 0
            for part in parts:
                values = [next(bound) for _ in part.values]
                exps = part.exponents or [0] * len(values)
                scale, offset = (None if x is None else next(bound)
                                 for x in (part.scale, part.offset))
                if offset is not None and len(ms) > 1:
                    values = [kb.let("w", _pow2(v, e) * scale + offset if scale is not None
                                     else _pow2(v, e) + offset) for v, e in zip(values, exps)]
                    exps, scale, offset = [0] * len(values), None, None
                bound_parts[-1].append((k, values, exps, scale, offset))
                k += len(values)
        # activations (and their sums) serve every column: bound once when there are several
        bind = (lambda x: kb.let("a", x)) if len(accs) > 1 else (lambda x: x)
        for lo, hi, act in phases():
            for u, (_, ok) in enumerate(slots):
                for j in range(len(ms)):
                    a, sum_a = {}, {}     # element -> activation, range -> sum
                    for t, column in enumerate(accs):
                        total = None
                        for first, values, exps, scale, offset in bound_parts[t * len(slots) + u]:
                            ks = range(max(lo, first), min(hi, first + len(values)))
                            if not ks:
                                continue
                            for i in ks:
                                if i not in a:
                                    a[i] = bind(act(j, u, i))
                            xs = [a[i] for i in ks]
                            mine = slice(ks.start - first, ks.stop - first)
                            term = _dot(xs, values[mine], exps[mine])
                            term = term if scale is None else term * scale
                            if offset is not None:
                                if ks not in sum_a:
                                    sum_a[ks] = bind(_dot(xs, [None] * len(xs)))
                                term = term + sum_a[ks] * offset
                            total = term if total is None else total + term
                        acc = column[j]
                        kb.assign(acc, acc + (total if ok is None else Sel(ok, total, p.zero())))
    if runs * p.run < p.k:
        for n, column in zip(ns, accs, strict=True):
            _gemv_elements(kb, p, lane, b, n, ms, column, runs * p.run)


def _gemv_int(kb, p: Problem, plan: RunPlan, lane, b, ns, ms, accs):
    """The integer GEMV's walk (accs[t][j]: column t, row j): per run slot and group of
    32, each row's 16 activation pair words are read once for all columns; each column
    adds (scale * dx) * f32(dot - centre * sum_q) + offset' * sum_x, where dot is 16
    Dot2 of the pair words with the group's bytes and offset' = offset + scale *
    (centre - bias) (None when it is 0). The first trip's weight loads go before the
    kernel's AwaitInputs (staged tiles, or a walk of one trip: all of them), so they
    overlap the kernel before this one. Returns each row's norm root (`_quantize_rows`)."""
    probe = p.w_int(0, i32(0), i32(0))
    centre = lambda g: 1 << (g.bits - 1)  # noqa: E731
    sums = any(g.offset is not None or g.bias != centre(g) for g in probe)
    trips = _int_trips(kb, p, plan, lane, b, ns, ms)
    first = None
    if plan.words is not None:
        next(trips)
        if EARLY_LOADS:
            kb.await_inputs()
    elif _int_one_trip(p) and EARLY_LOADS:
        slots, decode = next(trips)
        first = slots, _int_groups(kb, ns, slots, decode, centre)
        kb.await_inputs()
    act, dens = _quantize_rows(kb, p, b, ms, LANES * plan.groups, sums)
    walk = [first] if first else ((slots, _int_groups(kb, ns, slots, decode, centre))
                                  for slots, decode in trips)
    for slots, groups in walk:
        for u, (_, k, ok) in enumerate(slots):
            for gi in range(p.run // INT_BLOCK):
                kg = kb.let("kg", ix.add(k, INT_BLOCK * gi))
                blk = ix.div(kg, INT_BLOCK)
                half = ix.div(kg, 2)
                for j in range(len(ms)):
                    at = kb.let("xw", ix.add(ix.add(half, ix.div(half, INT_PAD)),
                                             j * _int_row_words(p.k)))
                    xs = [kb.let("xq", act[0][ix.add(at, i)].bitcast(DType.I32))
                          for i in range(INT_BLOCK // 2)]
                    at_blk = ix.add(blk, j * (p.k // INT_BLOCK))
                    dx, sq = kb.let("dx", act[1][at_blk]), kb.let("sq", act[2][at_blk])
                    sx = kb.let("sx", act[3][at_blk]) if sums else None
                    for t, column in enumerate(accs):
                        quads, scale, offset, c = groups[t * len(slots) + u][gi]
                        dot = i32(0)
                        for i, quad in enumerate(quads):
                            dot = Dot2(xs[2 * i], quad, dot)
                            dot = Dot2(xs[2 * i + 1], quad, dot, high=True)
                        term = (scale * dx) * (dot - sq * i32(c)).cast(DType.F32)
                        if offset is not None:
                            term = term + offset * sx
                        if ok is not None:
                            term = Sel(ok, term, p.zero())
                        kb.assign(column[j], column[j] + term)
    next(trips, None)                           # a walk of one trip: the generator ends
    return dens


def _int_groups(kb, ns, slots, decode, centre):
    """Each column's and slot's integer groups, their words and scales bound now (the
    loads issue here): [(quads, scale, offset', centre)] per (column, slot)."""
    decoded = [decode(t, n, k0) for t, n in enumerate(ns) for k0, _, _ in slots]
    flat = [x for gs in decoded for g in gs
            for x in (*g.quads, g.scale, g.offset) if x is not None]
    bound = iter(kb.let_shared("w", flat))
    groups = []
    for gs in decoded:
        groups.append([])
        for g in gs:
            quads = [next(bound) for _ in g.quads]
            scale = next(bound)
            offset = None if g.offset is None else next(bound)
            c = centre(g)
            if c != g.bias:
                shift = scale * f32(float(c - g.bias))
                offset = shift if offset is None else offset + shift
            groups[-1].append((quads, scale, offset, c))
    return groups


def _int_one_trip(p: Problem) -> bool:
    """Whether a lane's direct walk over K is one trip (K of at most 32 x unroll runs)."""
    return p.k // p.run <= LANES * _run_unroll(p)


def _quantize_rows(kb, p: Problem, b, ms, threads: int, sums: bool):
    """Rows `ms` of the activations as int16 pairs in shared memory, then a barrier:
    INT_EACH consecutive elements per thread, a block's threads adjacent (its max and sums
    are reductions of their width). Every activation load is issued before any arithmetic
    (the workgroup's weight loads wait behind this barrier; one dependent L2 round trip per
    trip would be microseconds). |x| and its max go through the f32 bits as integers (no
    NaN rules to follow for a non-negative max). With a row norm the rows quantized are
    x * g, and each thread also sums its elements' x^2 (a clamped chunk's not), which
    the workgroup adds up per row. Returns the arrays (pair words, dx per block, integer
    sum per block, f32 sum per block if `sums`), and each row's sqrt(sum x^2 / K + eps)
    (None without a row norm)."""
    blocks, width = p.k // INT_BLOCK, INT_BLOCK // INT_EACH
    row = _int_row_words(p.k)
    qa = kb.shared("act_q", DType.U32, len(ms) * row)
    qd = kb.shared("act_d", DType.F32, len(ms) * blocks)
    qn = kb.shared("act_n", DType.I32, len(ms) * blocks)
    qx = kb.shared("act_x", DType.F32, len(ms) * blocks) if sums else None
    li = local_index()
    trips = -(-p.k // (threads * INT_EACH))
    chunks = [kb.let("qc", ix.add(li, threads * t)) for t in range(trips)]
    first = [kb.let("qe", ix.mul(ix.minimum(c, i32(p.k // INT_EACH - 1)), INT_EACH))
             for c in chunks]
    norm = p.row_norm
    if norm is None:
        xs = [[[kb.let("x", p.a(b, m, ix.add(f, i))) for i in range(INT_EACH)]
               for f in first] for m in ms]
    else:
        raw = [[[kb.let("xr", norm.x(b, m, ix.add(f, i))) for i in range(INT_EACH)]
                for f in first] for m in ms]
        xs = [[[kb.let("x", x * norm.g(ix.add(f, i))) for i, x in enumerate(xr)]
               for f, xr in zip(first, row, strict=True)] for row in raw]
        parts = [_squares(kb, p, row, chunks, threads) for row in raw]   # x dies here
    for j in range(len(ms)):
        for t, c in enumerate(chunks):
            vals = xs[j][t]
            mags = [kb.let("xb", x.bitcast(DType.I32) & i32(0x7FFFFFFF)) for x in vals]
            top = mags[0]
            for mag in mags[1:]:
                top = maximum(top, mag)
            amax = kb.let("amax", kb.reduce("amax", ReduceOp.Max, top, width).bitcast(DType.F32))
            inv = kb.let("inv", Sel(ge(f32(0.0), amax), f32(0.0), f32(32767.0) / amax))
            qs = [kb.let("q", (x * inv + f32(MAGIC)).bitcast(DType.I32) - i32(MAGIC_BITS))
                  for x in vals]
            total = qs[0]
            for q in qs[1:]:
                total = total + q
            sq = kb.reduce("sq", ReduceOp.Sum, total, width)
            if sums:
                xsum = vals[0]
                for x in vals[1:]:
                    xsum = xsum + x
                sx = kb.reduce("sx", ReduceOp.Sum, xsum, width)
            words = [(q0.bitcast(DType.U32) & u32(0xFFFF)) | (q1.bitcast(DType.U32) << u32(16))
                     for q0, q1 in zip(qs[::2], qs[1::2], strict=True)]
            with kb.if_(ix.lt(c, i32(p.k // INT_EACH))):
                pair = ix.mul(c, INT_EACH // 2)
                at = kb.let("qw", ix.add(ix.add(pair, ix.div(pair, INT_PAD)), j * row))
                for i, word in enumerate(words):
                    kb.store(qa, ix.add(at, i), word)
                with kb.if_(ix.eq(ix.mod(c, width), i32(0))):
                    blk = ix.add(ix.div(c, width), j * blocks)
                    kb.store(qd, blk, amax * f32(1.0 / 32767.0))
                    kb.store(qn, blk, sq)
                    if sums:
                        kb.store(qx, blk, sx)
    dens = None if norm is None else [
        kb.let("den", norm.den(kb.reduce("ss", ReduceOp.Sum, part), p.k)) for part in parts]
    kb.barrier()
    return (qa, qd, qn, qx), dens


def _squares(kb, p: Problem, raw, chunks, threads: int) -> Expr:
    """A thread's sum of x^2 over its chunks of one row (those past the row, clamped onto
    its last, count nothing), which the workgroup then adds up."""
    part = None
    for c, xr in zip(chunks, raw, strict=True):
        sq = xr[0] * xr[0]
        for x in xr[1:]:
            sq = sq + x * x
        if len(chunks) * threads * INT_EACH > p.k:
            sq = Sel(ix.lt(c, i32(p.k // INT_EACH)), sq, f32(0.0))
        part = sq if part is None else part + sq
    return kb.let("ssp", part)


def _int_trips(kb, p: Problem, plan: RunPlan, lane, b, ns, ms):
    """Per trip: slots (k0 to decode at, absolute k of the run, None or the I32 mask of a
    slot past K) and decode(t, n, k0) -> [IntGroup]: lanes take runs lane + 32u; from the
    weight's own words (one trip of clamped runs where K allows, `_int_one_trip`), or
    from the staged weight tile (`plan.words`, whole trips): then the generator first
    yields None once the first trip's loads are issued (the caller quantizes its rows
    meanwhile), and each trip stores the words held in registers, loads the next trip's
    into them while the lanes compute, and ends at a barrier so the next store waits for
    every read."""
    unroll, runs = _run_unroll(p), p.k // p.run
    direct = lambda t, n, k0: p.w_int(b, n, k0)  # noqa: E731
    if plan.words is None and _int_one_trip(p):  # clamped runs, masked (ok) where past K
        slots = []
        for u in range(-(-runs // LANES)):
            run = ix.add(lane, LANES * u)
            ok = None if LANES * (u + 1) <= runs else ix.lt(run, i32(runs))
            k0 = kb.let("k0", ix.mul(run if ok is None else ix.minimum(run, i32(runs - 1)),
                                     p.run))
            slots.append((k0, k0, ok))
        yield slots, direct
        return
    if plan.words is None:
        for items in _unrolled(kb, lane, 0, runs, unroll):
            k0s = [kb.let("k0", ix.mul(r, p.run)) for r in items]
            yield [(k0, k0, None) for k0 in k0s], direct
        return
    fetch, put, decode = _weight_tile(kb, p, plan, lane, b, ms[0], ns,
                                      reader=lambda k0, load: p.w_int(b, i32(0), k0, load))
    step = LANES * unroll * p.run
    if plan.stages:
        yield from _async_trips(kb, p, plan, lane, step, fetch, decode)
        return
    held = fetch(i32(0), None, kb.var)          # in flight while the rows are quantized
    yield None
    with kb.for_("kc", 0, p.k, step) as kc:
        put(held)
        ahead = kb.let("kn", ix.minimum(ix.add(kc, step), i32(p.k - step)))
        for (_, var, _), (_, word, _) in zip(held, fetch(ahead, None, lambda _, x: x),
                                             strict=True):
            kb.assign(var, word)                # the next trip's words, read while this one's
        k0s = [kb.let("k0", ix.mul(ix.add(lane, LANES * u), p.run)) for u in range(unroll)]
        yield [(k0, ix.add(kc, k0), None) for k0 in k0s], decode
        kb.barrier()


def _async_trips(kb, p: Problem, plan: RunPlan, lane, step: int, fetch, decode):
    """`_int_trips` over tiles filled by async copies (`plan.stages` of them): the first
    stages' copies issue before the rows are quantized (the first yield, None); each trip
    waits for its own copies, and where later trips remain, refills its tile with the
    trip `stages` ahead once every lane is done reading it. Each trip commits one batch
    (empty where nothing is left, every trip where all were issued first), so each wait
    for stages - 1 batches in flight is a wait for that trip's own."""
    stages, trips = plan.stages, p.k // step
    for s in range(stages):
        fetch(i32(s * step), None, stage=i32(s))
        kb.copy_commit()
    yield None
    with kb.for_("kc", 0, p.k, step) as kc:
        kb.copy_wait(stages - 1)
        kb.barrier()
        stage = kb.let("st", ix.mod(ix.div(kc, step), stages)) if stages > 1 else i32(0)
        k0s = [kb.let("k0", ix.mul(ix.add(lane, LANES * u), p.run))
               for u in range(_run_unroll(p))]
        yield ([(k0, ix.add(kc, k0), None) for k0 in k0s],
               lambda t, n, k0: decode(t, n, k0, stage))
        if trips > stages:
            kb.barrier()
            ahead = kb.let("kn", ix.add(kc, stages * step))
            with kb.if_(ix.lt(ahead, i32(p.k))):
                fetch(ahead, None, stage=stage)
        kb.copy_commit()


def _stage_span(p: Problem, rows: int, per: int, groups: int, budget: int) -> int | None:
    """Elements of each of `per` runs whose activations one staging phase holds in shared
    memory (the tile within `budget` bytes), or None (no such span that the workgroup's
    threads copy in whole steps)."""
    span = p.run
    while span > 1 and rows * per * (span + 1) * p.acc.itemsize > budget:
        span //= 2
    fits = rows * per * (span + 1) * p.acc.itemsize <= budget
    return span if fits and per * span % (LANES * groups) == 0 else None


def _direct_trips(kb, p: Problem, lane, b, ms, runs: int, unroll: int):
    """Per trip of `_unrolled` runs: slots (k0, None), one phase whose activations are
    read where they are, and decode(t, n, k0) from the weight's own words."""
    for items in _unrolled(kb, lane, 0, runs, unroll):
        k0s = [kb.let("k0", ix.mul(r, p.run)) for r in items]
        yield [(k0, None) for k0 in k0s], lambda k0s=k0s: [
            (0, p.run, lambda j, u, i: p.a(b, ms[j], ix.add(k0s[u], i)))], \
            lambda t, n, k0: p.w_run(b, ms[0], n, k0)


def _staged_trips(kb, p: Problem, plan: RunPlan, lane, b, ns, ms, runs: int, unroll: int):
    """Per trip of LANES * unroll runs per group (the same K range for every group):
    slots (k0, ok), phases that copy `plan.span` elements of each run's activations to a
    shared tile before the lanes read them, and decode(t, n, k0), column t's runs. Lanes a
    run apart reading activations directly would take a cache line each per element; the
    whole workgroup copies them instead (runs of `span` floats, once for all its columns),
    with one pad word per run so that lanes reading the same element of their runs hit
    distinct banks. With `plan.words` the weights' words are staged first (`_weight_tile`)
    and k0 counts from the trip's start. Whole trips loop; a last partial trip follows, its
    missing slots dropped or masked (ok) and their runs clamped."""
    span = plan.span
    per, threads = LANES * unroll, LANES * plan.groups
    pitch, step = per * (span + 1), threads // span      # tile row; runs per staging store
    tile = kb.shared("tile_a", p.acc, len(ms) * pitch)
    li = local_index()
    spot = kb.let("spot", ix.add(ix.mul(ix.div(li, span), span + 1), ix.mod(li, span)))
    src = kb.let("src", ix.add(ix.mul(ix.div(li, span), p.run), ix.mod(li, span)))
    at = ix.mul(lane, span + 1)                          # a lane's run in the tile
    stage = None
    if plan.words is not None:
        fetch, put, decode_tile = _weight_tile(kb, p, plan, lane, b, ms[0], ns)

        def stage(kc, kc0):
            put(fetch(kc, kc0, kb.let))
            return decode_tile

    def trip(kc, count: int, kc0: int | None = None):
        slots = []
        for u in range(-(-count // LANES)):
            run = ix.add(lane, LANES * u) if stage else \
                ix.add(ix.add(ix.div(kc, p.run), lane), LANES * u)
            ok = None if LANES * (u + 1) <= count else ix.lt(lane, i32(count - LANES * u))
            last = count - 1 if stage else runs - 1
            slots.append((kb.let("k0", ix.mul(run if ok is None else ix.minimum(
                run, i32(last)), p.run)), ok))
        decode = stage(kc, kc0) if stage else lambda t, n, k0: p.w_run(b, ms[0], n, k0)

        def phases():
            for lo in range(0, p.run, span):
                for j, m in enumerate(ms):
                    for s in range(per * span // threads):
                        k = ix.add(kc, ix.add(src, lo + s * step * p.run))
                        k = k if count == per else ix.minimum(k, i32(p.k - 1))
                        kb.store(tile, ix.add(spot, j * pitch + s * step * (span + 1)),
                                 p.a(b, m, k))
                kb.barrier()
                yield lo, lo + span, lambda j, u, i, lo=lo: tile[
                    ix.add(at, j * pitch + u * LANES * (span + 1) + i - lo)]
                kb.barrier()
        return slots, phases, decode

    full = runs // per
    if full:
        with kb.for_("kc", 0, full * per * p.run, per * p.run) as kc:
            yield trip(kc, per)
    if full * per < runs:
        kc0 = full * per * p.run
        yield trip(i32(kc0), runs - full * per, kc0)


def _weight_tile(kb, p: Problem, plan: RunPlan, lane, b, m, ns, reader=None):
    """A shared tile of each group's columns' weight words for one trip, as (fetch, put,
    decode): fetch(kc, kc0, bind) loads the trip from k = kc on (kc0: its value in the last,
    partial trip, whose words are clamped to the row), put(copies) stores them to the tile
    and waits at a barrier, decode(t, n, k0) decodes a run from the copy. Load s of
    lane l reads word 32s + l of a role's span (consecutive lanes, consecutive words); the
    lanes then read their runs' words from the tile: a run of R words per lane is R apart,
    conflict-free when R is odd (Q4_0: 9, Q8_0: 17, Q4_1: 5); every other format reads its
    runs' words in a pattern of its own (`_chunk_pad`). The copy is read (decoded) before
    the activation phases, whose barriers keep the next trip's copy after it. `reader(k0,
    load)` decodes a run from the copy (default: `p.w_run` of row 0)."""
    if reader is None:
        reader = lambda k0, load: p.w_run(b, m, i32(0), k0, load=load)  # noqa: E731
    pitch, pad = _pitch(plan.words), _chunk_pad(p, plan.quads)
    each = plan.groups * plan.width * pitch     # words of one tile (one trip)
    tile = kb.shared("tile_w", DType.U32, each * max(1, plan.stages))
    mine = kb.let("wt", ix.mul(ix.div(local_index(), LANES), plan.width * pitch))
    offsets, at = {}, 0
    for role, count in plan.words.items():
        offsets[role], at = at, at + count

    def fetch(kc, kc0, bind=None, stage=None):
        """The trip's word loads, bound by `bind(name, load)`: (tile spot, word, mask);
        with `stage`, 16-byte async copies into that tile instead (returns nothing)."""
        copies = []
        for t, n in enumerate(ns):
            for role, (buf, e, w) in p.w_chunks.items():
                row, count = p.k * p.parts // e * w, plan.words[role] // (w + pad) * w
                k = kc if p.parts == 1 else ix.add(kc, ix.mul(b, p.k))
                start = kb.let("ws", ix.add(ix.mul(n, row), ix.mul(ix.div(k, e), w)))
                if stage is not None:
                    base = ix.add(ix.mul(stage, each), ix.add(mine, t * pitch + offsets[role]))
                    _copy_words(kb, tile, base, kb.array(buf), start, lane, count)
                    continue
                limit = count if kc0 is None else min(count, row - kc0 // e * w)
                for s in range(0, count, LANES):     # all loads in flight, then the stores
                    i = ix.add(lane, s)
                    at = i if s + LANES <= limit else ix.minimum(i, i32(limit - 1))
                    word = bind("wv", Load(buf, ix.add(start, at), DType.U32))
                    spot = ix.add(i, ix.div(i, w)) if pad else i
                    copies.append((ix.add(mine, ix.add(spot, t * pitch + offsets[role])), word,
                                   None if s + LANES <= count else ix.lt(lane, i32(count - s))))
        return copies

    def put(copies):
        for spot, word, partial in copies:
            if partial is None:
                kb.store(tile, spot, word)
            else:
                with kb.if_(partial):
                    kb.store(tile, spot, word)
        kb.barrier()

    def decode(t, n, k0, stage=None):
        first = ix.i32(t * pitch) if stage is None else ix.add(ix.mul(stage, each), t * pitch)
        if pad:     # the run decoded at its place in its chunk, the chunk found here
            ((_, e, w),) = p.w_chunks.values()
            first = kb.let("wc", ix.add(first, ix.mul(ix.div(k0, e), w + pad)))
            k0 = ix.mod(k0, e)
        quads = {}

        def load(role, index):
            start = ix.add(first, offsets[role])
            if plan.quads:      # mine, first and the offsets are multiples of 4
                rest, c = ix.split_offset(ix.i32(index))
                if rest is None or ix.low_zeros(rest) >= 2:
                    key = (role, str(rest), c >> 2)
                    if key not in quads:
                        spot = ix.i32(c & ~3) if rest is None else ix.add(rest, c & ~3)
                        quads[key] = kb.load_wide("w", tile, ix.add(mine, ix.add(spot, start)),
                                                  4)
                    return quads[key][c & 3]
            return tile[ix.add(mine, ix.add(ix.i32(index), start))]
        return reader(k0, load)
    return fetch, put, decode


def _copy_words(kb, tile, base, src, start, lane, count: int):
    """Words start .. start + count - 1 of `src` -> tile[base ...] by the 32 lanes, 16
    bytes (4 words) a lane and copy, consecutive lanes on consecutive spans."""
    for c in range(0, count, 4 * LANES):
        i = ix.add(ix.mul(lane, 4), c)
        if c + 4 * LANES <= count:
            kb.copy_async(tile, ix.add(base, i), src, ix.add(start, i), i32(1))
        else:
            with kb.if_(ix.lt(i, i32(count))):
                kb.copy_async(tile, ix.add(base, i), src, ix.add(start, i), i32(1))


def _dot(a: list[Expr], w: list, exps: list[int] | None = None) -> Expr:
    """sum(a[i] * w[i] * 2^exps[i]) (w[i] None: a[i] alone): one sum left to right per
    exponent, then each scaled by its power of two (exact) and added."""
    sums = {}
    for x, y, e in zip(a, w, exps or [0] * len(a), strict=True):
        term = x if y is None else x * y
        sums[e] = term if e not in sums else sums[e] + term
    total = None
    for e, part in sums.items():
        total = _pow2(part, e) if total is None else total + _pow2(part, e)
    return total


def _pow2(x: Expr, e: int) -> Expr:
    return x if e == 0 else x * Const(2.0 ** e, x.dtype)


def gemm_kernel(p: Problem, kb_factory, declare):
    """16x16 threads, each computing R x R outputs (rows ty + 16i, columns tx + 16j) of a
    16R x 16R tile; operands staged through shared tiles of 16 along K, rows padded to 17
    words so the threads of a warp read distinct banks. R = 4 once M fills the tile."""
    r = 4 if p.m >= 4 * TILE else 1
    edge, pitch = TILE * r, TILE + 1
    grid = (-(-p.n // edge), -(-p.m // edge), p.batch)
    kb = kb_factory(grid, (TILE, TILE))
    declare(kb)
    sa = kb.shared("tile_a", p.acc, edge * pitch)
    sw = kb.shared("tile_w", p.acc, edge * pitch)
    tx, ty, b = local_id(0), local_id(1), group_id(2)
    m0 = kb.let("m0", ix.mul(group_id(1), edge))
    n0 = kb.let("n0", ix.mul(group_id(0), edge))
    accs = [[kb.var("acc", p.zero()) for _ in range(r)] for _ in range(r)]
    with kb.for_("k0", 0, p.k, TILE) as k0:
        for u in range(r):   # each thread stages r elements of each tile, coalesced along K
            e = ix.add(local_index(), TILE * TILE * u)
            row, kk = kb.let("row", ix.div(e, TILE)), kb.let("kk", ix.mod(e, TILE))
            k = kb.let("k", ix.add(k0, kk))
            kc = ix.minimum(k, i32(p.k - 1))
            slot = ix.add(ix.mul(row, pitch), kk)
            for tile, base, size, value in ((sa, m0, p.m, lambda x, kc=kc: p.a(b, x, kc)),
                                            (sw, n0, p.n, lambda x, kc=kc: p.w(b, None, x, kc))):
                at = ix.add(base, row)
                ok = ix.both(ix.lt(at, i32(size)), ix.lt(k, i32(p.k)))
                kb.store(tile, slot, Sel(ok, value(ix.minimum(at, i32(size - 1))), p.zero()))
        kb.barrier()
        with kb.for_("j", 0, TILE) as j:
            a_vals = [kb.let("a", sa[ix.add(ix.mul(ix.add(ty, TILE * i), pitch), j)])
                      for i in range(r)]
            w_vals = [kb.let("w", sw[ix.add(ix.mul(ix.add(tx, TILE * jj), pitch), j)])
                      for jj in range(r)]
            for i in range(r):
                for jj in range(r):
                    kb.assign(accs[i][jj], accs[i][jj] + a_vals[i] * w_vals[jj])
        kb.barrier()
    for i in range(r):
        for jj in range(r):
            m = kb.let("m", ix.add(m0, ix.add(ty, TILE * i)))
            n = kb.let("n", ix.add(n0, ix.add(tx, TILE * jj)))
            with kb.if_(ix.both(ix.lt(m, i32(p.m)), ix.lt(n, i32(p.n)))):
                p.store(kb, b, m, n, accs[i][jj])
    return kb.finish()
