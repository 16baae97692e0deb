"""The contraction kernels every matmul-like op shares: out[b, m, n] = sum_k a * w.

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
* Tiled GEMM (many rows, prefill): 16x16 output tiles, operands staged through
  shared memory tiles of 16 along K (widened to the accumulator type).

Weights that differ per row (IndexedMatMul, MoE) take the GEMV schedule with
one group per output element.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from poot.codegen import index as ix
from poot.codegen.builder import KernelBuilder
from poot.codegen.expr import Const, Expr, Sel, i32
from poot.codegen.lower import mma
from poot.codegen.program import group_id, local_id, local_index
from poot.dtypes import DType
from poot.ir.ops import ReduceOp

LANES = 32        # threads that share one dot product in the GEMV schedule
GROUPS = 8        # dot products per workgroup in the GEMV schedule
TILE = 16         # GEMM tile edge
GEMV_MAX_ROWS = 4
UNROLL = 4        # strided items per lane per loop trip in the GEMV schedule
RUN_TRIP = 64     # weight elements per lane per trip when decoding runs (>= 32 bytes of 4-bit)
RUN_COLUMNS = 2   # weight rows per group when decoding runs over staged activations
SHARED_BYTES = 16 * 1024   # staged activations stay within this (WebGPU devices have 16 KiB+)

Elem = Callable[..., Expr]


@dataclass
class Problem:
    """One contraction. Indices are I32 expressions; element functions return `acc` dtype.

    a(b, m, k); w(b, m, n, k) (m matters only when `w_per_row`);
    w_pair(b, n, kw) -> (w[2kw], w[2kw+1]) when the weight is read two per word (K even);
    w_run(b, m, n, k0) -> [RunPart]: w[k0 : k0 + run] (k0 a multiple of `run`), see
    poot.formats.RunPart;
    a_pair(b, m, kw) likewise for the activation; store(kb, b, m, n, acc) writes one result.
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
    tiles: object = None          # mma.Tiles: 16-bit operands tensor cores can read as is
    features: frozenset = frozenset()   # the target's optional statements (Sig.features)

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


def store_flat(sig, m_count: int, n_count: int, epilogue=None):
    """Store out[(b*M + m)*N + n] = acc cast to the output dtype, through `epilogue`
    (flat index, acc) -> value when given."""
    def store(kb, b, m, n, acc):
        idx = kb.let("o", ix.add(ix.mul(ix.add(ix.mul(b, m_count), m), n_count), n))
        value = acc.cast(sig.out.dtype) if epilogue is None else epilogue(kb, idx, acc)
        kb.store("out", idx, value)
    return store


def lower_contraction(sig):
    from poot.codegen.program import Lowering

    p = PROBLEMS[type(sig.op)](sig, None)
    p.features = sig.features
    declare = lambda kb: sig.declare_all(kb, p.views)  # noqa: E731
    return Lowering((contraction_kernel(p, lambda g, wg: sig.builder(g, wg), declare),))


def contraction_kernel(p: Problem, kb_factory: Callable[[tuple, tuple], KernelBuilder],
                       declare: Callable[[KernelBuilder], None]):
    if p.w_per_row or p.m <= GEMV_MAX_ROWS:
        return gemv_kernel(p, kb_factory, declare)
    if mma.usable(p, p.features):
        return mma.mma_gemm_kernel(p, kb_factory, declare)
    return gemm_kernel(p, kb_factory, declare)


def gemv_kernel(p: Problem, kb_factory, declare):
    rows = p.m if not p.w_per_row else 1        # rows sharing one weight column per group
    columns = p.batch * p.n * (p.m if p.w_per_row else 1)
    width = _run_columns(p, rows)               # columns per group
    grid, blk = ix.launch_groups(-(-columns // (GROUPS * width)))
    kb = kb_factory(grid, (LANES * GROUPS,))
    declare(kb)
    lane = kb.let("lane", ix.mod(local_index(), LANES))
    group = kb.let("col", ix.add(ix.mul(blk, GROUPS), ix.div(local_index(), LANES)))
    cols = [group if width == 1 else kb.let("col", ix.add(ix.mul(group, width), t))
            for t in range(width)]
    # every group runs the loop (its reduction must be uniform); spare ones use the last column
    cs = [kb.let("c", ix.minimum(col, i32(columns - 1))) for col in cols]
    ns = [kb.let("n", ix.mod(c, p.n)) for c in cs]
    rest = kb.let("rest", ix.div(cs[0], p.n))   # one batch per group (width > 1: batch 1)
    if p.w_per_row:
        ms = [kb.let("m", ix.mod(rest, p.m))]
        b = kb.let("b", ix.div(rest, p.m))
    else:
        ms = [i32(m) for m in range(rows)]
        b = rest
    accs = [[kb.var(f"acc{j}", p.zero()) for j in range(len(ms))] for _ in ns]
    if p.w_pair is not None and not p.w_per_row and p.k % 2 == 0:
        _gemv_words(kb, p, lane, b, ns[0], ms, accs[0])
    elif p.w_run is not None and p.run > 1:
        _gemv_runs(kb, p, lane, b, ns, ms, accs)
    else:
        _gemv_elements(kb, p, lane, b, ns[0], ms, accs[0], 0)
    for col, n, column in zip(cols, ns, accs, strict=True):
        sums = [kb.reduce("dot", ReduceOp.Sum, acc, LANES) for acc in column]
        with kb.if_(ix.both(ix.eq(lane, i32(0)), ix.lt(col, i32(columns)))):
            for total, m in zip(sums, ms, strict=True):
                p.store(kb, b, m, n, total)
    return kb.finish()


def _run_columns(p: Problem, rows: int) -> int:
    """Columns one group computes: RUN_COLUMNS where runs read staged activations (each
    activation a lane reads from the tile then serves that many weight rows: a 4-bit
    weight costs only a few instructions, and one shared load per element was a fifth of
    them), else 1."""
    staged = p.w_run is not None and p.run > 1 and not (p.w_pair is not None and p.k % 2 == 0)
    if not staged or _stage_span(p, rows, max(1, RUN_TRIP // p.run)) is None:
        return 1
    return RUN_COLUMNS


def _unrolled(kb, lane, start: int, stop: int, unroll: int = UNROLL):
    """A lane's strided walk over items start .. stop - 1 (adjacent lanes, adjacent items):
    yields, per loop trip, the item indices the lane takes. Trips of `unroll` items, LANES
    apart, while whole such trips remain (every slot loads before any use, so `unroll`
    coalesced loads are in flight per lane), then trips of one item for the rest. Every
    item yielded is in range: no clamping or masking."""
    stride = LANES * unroll
    full = start + (stop - start) // stride * stride
    if full > start:
        with kb.for_("base", ix.add(lane, start), full, stride) as base:
            yield [ix.add(base, LANES * u) for u in range(unroll)]
    if full < stop:
        with kb.for_("it", ix.add(lane, full), stop, LANES) as it:
            yield [it]


def _gemv_words(kb, p: Problem, lane, b, n, ms, accs):
    """16-bit weights, two per U32 word: each lane reads whole words, 8 in flight on long
    rows (few columns of long rows need more loads in flight per lane to fill the memory
    pipe: N=4096, K=14336 ran at 55% of copy bandwidth with 4)."""
    words_per_row = p.k // 2
    unroll = 2 * UNROLL if words_per_row >= 4 * LANES * 2 * UNROLL else UNROLL
    for slots in _unrolled(kb, lane, 0, words_per_row, unroll):
        words = [tuple(kb.let("w", x) for x in p.w_pair(b, n, kw)) for kw in slots]
        for kw, (w0, w1) in zip(slots, words, strict=True):
            k0 = kb.let("k0", ix.mul(kw, 2))
            for acc, m in zip(accs, ms, strict=True):
                kb.assign(acc, acc + p.a(b, m, k0) * w0 + p.a(b, m, ix.add(k0, 1)) * w1)


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


def _gemv_runs(kb, p: Problem, lane, b, ns, ms, accs):
    """Packed weights, a run of `p.run` consecutive k per lane and slot, for columns `ns`
    (accs[t][j]: column t, row j): the words and scales of every run in flight are loaded
    once (let_shared binds them first), then each part adds scale * sum(a * value) +
    offset * sum(a) per row, each activation read once for all columns. With an offset and
    several rows it is cheaper to decode w = scale * value + offset once and share it; K
    past the last whole run goes element by element."""
    runs = p.k // p.run
    unroll = max(1, RUN_TRIP // p.run)
    span = _stage_span(p, len(ms), unroll)
    walk = _direct_trips(kb, p, lane, b, ms, runs, unroll) if span is None else \
        _staged_trips(kb, p, lane, b, ms, runs, unroll, span)
    for slots, phases in walk:
        decoded = [p.w_run(b, ms[0], n, k0) for n in ns for k0, _ in slots]
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


def _stage_span(p: Problem, rows: int, unroll: int) -> int | None:
    """Elements of each run whose activations one staging phase holds in shared memory
    (the tile stays within SHARED_BYTES), or None to read activations directly: rows whose
    weights differ per group, or batches, share nothing across the workgroup."""
    if p.w_per_row or p.batch > 1:
        return None
    per, span = LANES * unroll, p.run
    while span > 1 and rows * per * (span + 1) * p.acc.itemsize > SHARED_BYTES:
        span //= 2
    return span if per * span % (LANES * GROUPS) == 0 else None


def _direct_trips(kb, p: Problem, lane, b, ms, runs: int, unroll: int):
    """Per trip of `_unrolled` runs: slots (k0, None) and one phase whose activations are
    read where they are."""
    for items in _unrolled(kb, lane, 0, runs, unroll):
        k0s = [kb.let("k0", ix.mul(r, p.run)) for r in items]
        yield [(k0, None) for k0 in k0s], lambda k0s=k0s: [
            (0, p.run, lambda j, u, i: p.a(b, ms[j], ix.add(k0s[u], i)))]


def _staged_trips(kb, p: Problem, lane, b, ms, runs: int, unroll: int, span: int):
    """Per trip of LANES * unroll runs per group (the same K range for every group):
    slots (k0, ok), and phases that copy `span` elements of each run's activations to a
    shared tile before the lanes read them. Lanes a run apart reading activations directly
    would take a cache line each per element; the whole workgroup copies them instead
    (runs of `span` floats, once for all its columns), with one pad word per run so that
    lanes reading the same element of their runs hit distinct banks. Whole trips loop; a
    last partial trip follows, its missing slots dropped or masked (ok) and their runs
    clamped."""
    per, threads = LANES * unroll, LANES * GROUPS
    pitch, step = per * (span + 1), threads // span      # tile row; runs per staging store
    tile = kb.shared("tile_a", p.acc, len(ms) * pitch)
    li = local_index()
    spot = kb.let("spot", ix.add(ix.mul(ix.div(li, span), span + 1), ix.mod(li, span)))
    src = kb.let("src", ix.add(ix.mul(ix.div(li, span), p.run), ix.mod(li, span)))
    at = ix.mul(lane, span + 1)                          # a lane's run in the tile

    def trip(kc, count: int):
        slots = []
        for u in range(-(-count // LANES)):
            run = ix.add(ix.add(ix.div(kc, p.run), lane), LANES * u)
            ok = None if LANES * (u + 1) <= count else ix.lt(lane, i32(count - LANES * u))
            slots.append((kb.let("k0", ix.mul(run if ok is None else ix.minimum(
                run, i32(runs - 1)), p.run)), ok))

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
        return slots, phases

    full = runs // per
    if full:
        with kb.for_("kc", 0, full * per * p.run, per * p.run) as kc:
            yield trip(kc, per)
    if full * per < runs:
        yield trip(i32(full * per * p.run), runs - full * per)


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
