"""The integer GEMV: packed weights whose runs are integer bytes (`Problem.w_int`) on a
target that declares DOT2 (int8 rows also on one that declares only DOT4).

The workgroup first quantizes its activation rows to int16 per block of 32 in shared
memory (scale max|x| / 32767, round to nearest; the block's integer sum and exact f32 sum
kept), then the GEMV's runs multiply the weight's bytes with them in `Dot2` pairs (exact
int32 sums) and scale each block's sum once; staged weight words of the next trip are
loaded into registers while a trip computes (the first trip's while the rows are
quantized). 4-bit (8-bit) quants are centred on 8 (128) through the integer sum, so the
activations' rounding meets (u - centre), not u; the rest of the affine offset meets the
exact f32 sum. Where each workgroup would quantize many activations per column it
computes (an 8B down projection, K = 14336) or the grid has few workgroups (its K/V
projections), K splits into parts (`int_parts`): a first kernel's workgroups each take
one part of K for their columns and store partial sums to scratch; a second adds the
parts and applies the store (and epilogue; `dot.contraction_program`).

A problem of int8 rows (`Problem.q8`, Q8PackedContraction) quantizes each block by the
composite's own rule instead (d = max|x| / 127, QuantizeI8's codes, four to a word,
multiplied with the weight's bytes by `Dot4`: dp4a, SPIR-V SUDot, WGSL dot4I8Packed), so
the integer sums are those of its definition exactly; the block's sum that meets the
weight's offset is then d * sum_q, the sum of the rounded activations.
"""
from __future__ import annotations

from dataclasses import replace

from poot.codegen import index as ix
from poot.codegen.expr import Dot2, Dot4, Expr, Sel, f32, ge, i32, maximum, u32
from poot.codegen.lower.problem import Problem
from poot.codegen.lower.quantize import quantize_i8
from poot.codegen.lower.runs import (
    RunPlan,
    pitch,
    quad_chunks,
    run_unroll,
    trip_words,
    unrolled,
    weight_tile,
)
from poot.codegen.lower.schedule import GEMV_MAX_ROWS, LANES, DotSchedule
from poot.codegen.program import local_index
from poot.codegen.target import DOT2, DOT4, WIDE_LOADS
from poot.dtypes import DType
from poot.ir.ops import Q8_MAX, ReduceOp

INT_BLOCK = 32       # activations per int16 scale (the integer groups' length)
INT_PAD = 32         # quantized activation words per pad word (lanes a run apart: no conflict)
INT_EACH = 8         # activations each thread quantizes (a block's 4 threads reduce together)
#: 1.5 * 2^23: y + MAGIC holds round-to-nearest(y) in its low mantissa bits for |y| < 2^22
MAGIC, MAGIC_BITS = 12582912.0, 0x4B400000


def k_parts(p: Problem, parts: int, store) -> Problem:
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


def int_parts(p: Problem, features, s: DotSchedule) -> int:
    """Parts K splits into for the integer GEMV (1: none). It splits where a workgroup
    would quantize more than `s.int_column_k` activations per column it computes, or the
    grid would have fewer than `s.int_min_groups` workgroups: into the fewest parts, at
    least `s.int_part_k` long, that fix that (else the most there are), keep a staged
    weight tile where the whole row had one and keep three quarters of a warp's lanes on
    runs."""
    if p.m > GEMV_MAX_ROWS or p.w_per_row or p.batch > 1:
        return 1
    plan = int_plan(p, p.m, features, s)
    if plan is None or not _wants_split(p, plan, s):
        return 1
    best = 1
    for parts in range(2, s.int_max_parts + 1):
        k = p.k // parts
        if (p.k % parts or k < s.int_part_k or k % p.run or 4 * (k // p.run) < 3 * LANES
                or any(k % e for _, e, _ in p.w_chunks.values())):
            continue
        q = k_parts(p, parts, p.store)
        sub = int_plan(q, q.m, features, s)
        if (sub is None or (plan.words is not None and sub.words is None)
                or p.n % (sub.width * sub.groups)):
            continue        # a workgroup's columns must lie in one part (shared activations)
        best = parts
        if not _wants_split(q, sub, s):
            break
    return best


def _wants_split(p: Problem, plan: RunPlan, s: DotSchedule) -> bool:
    columns = plan.width * plan.groups
    return p.k > columns * s.int_column_k or p.batch * -(-p.n // columns) < s.int_min_groups


def int_plan(p: Problem, rows: int, features, s: DotSchedule) -> RunPlan | None:
    """The integer GEMV where the target declares DOT2 (DOT4 for int8 rows: Dot4 only)
    and the weight's runs are whole integer groups of 32 (None otherwise: the f32
    schedules, e.g. Q5_x, Q2_K, Q3_K, Q6_K, IQ4_NL, MXFP4 and every non-GGUF format):
    its quantized activations and, where the weight's words lie in K order over whole
    trips, a weight tile of the staged schedule (`runs.weight_tile`) within
    `s.int_shared_bytes`; else each lane loads its runs' words."""
    # every K takes it by default: the shapes where it loses are in docs/performance.md
    dots = DOT2 in features or (p.q8 and DOT4 in features)
    if (not dots or p.w_int is None or p.w_per_row or p.batch != p.parts
            or p.run % INT_BLOCK or p.k % p.run or p.k >= s.int_max_k):
        return None
    if p.w_int(0, i32(0), i32(0)) is None:
        return None
    act = 4 * rows * (_row_words(p.k, _codes_per_word(p)) + 3 * (p.k // INT_BLOCK))
    if act > s.int_shared_bytes:
        return None
    width = s.run_columns if p.n >= s.int_wide_n else 1
    per = LANES * run_unroll(p, s)
    quads = s.quads and WIDE_LOADS in features and quad_chunks(p)
    words = trip_words(p, per, quads) if p.k % (per * p.run) == 0 else None
    # the most threads first: they share the quantization of the rows
    options = ((width, s.groups), (1, s.groups), (width, s.groups // 2)) if words else ()
    for cols, groups in options:
        if act + 4 * groups * cols * pitch(words) <= s.int_shared_bytes:
            return RunPlan(cols, groups, s.unroll, words=words, integer=True, quads=quads)
    return RunPlan(width, s.groups, s.unroll, integer=True)


def _codes_per_word(p: Problem) -> int:
    """Quantized activations a shared word holds: four int8 codes (`p.q8`), else two
    int16."""
    return 4 if p.q8 else 2


def _row_words(k: int, per: int = 2) -> int:
    """Shared words of one row of quantized activations, `per` a word, pads included."""
    return k // per + k // per // INT_PAD


def gemv_int(kb, p: Problem, plan: RunPlan, lane, b, ns, ms, accs, s: DotSchedule):
    """The integer GEMV's walk (accs[t][j]: column t, row j): per run slot and group of
    32, each row's 16 activation pair words are read once for all columns; each column
    adds (scale * dx) * f32(dot - centre * sum_q) + offset' * sum_x, where dot is 16
    Dot2 of the pair words with the group's bytes and offset' = offset + scale *
    (centre - bias) (None when it is 0). The first trip's weight loads go before the
    kernel's AwaitInputs (staged tiles, or a walk of one trip: all of them), so they
    overlap the kernel before this one (`s.early_loads`). Returns each row's norm root
    (`_quantize_rows`)."""
    probe = p.w_int(0, i32(0), i32(0))
    centre = lambda g: 1 << (g.bits - 1)  # noqa: E731
    sums = any(g.offset is not None or g.bias != centre(g) for g in probe)
    trips = _int_trips(kb, p, plan, lane, b, ns, ms, s)
    first = None
    if plan.words is not None:
        next(trips)
        if s.early_loads:
            kb.await_inputs()
    elif _one_trip(p, s) and s.early_loads:
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
                per = _codes_per_word(p)
                word = ix.div(kg, per)
                for j in range(len(ms)):
                    at = kb.let("xw", ix.add(ix.add(word, ix.div(word, INT_PAD)),
                                             j * _row_words(p.k, per)))
                    xs = [kb.let("xq", act[0][ix.add(at, i)].bitcast(DType.I32))
                          for i in range(INT_BLOCK // per)]
                    at_blk = ix.add(blk, j * (p.k // INT_BLOCK))
                    dx, sq = kb.let("dx", act[1][at_blk]), kb.let("sq", act[2][at_blk])
                    sx = None if not sums else kb.let(
                        "sx", dx * sq.cast(DType.F32) if p.q8 else act[3][at_blk])
                    for t, column in enumerate(accs):
                        quads, scale, offset, c, bits = groups[t * len(slots) + u][gi]
                        dot = i32(0)
                        for i, quad in enumerate(quads):     # byte b: element 4i + b
                            if per == 4:
                                dot = Dot4(xs[i], quad, dot, b_bits=bits)
                            else:
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
    loads issue here): [(quads, scale, offset', centre, bits)] per (column, slot)."""
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
            groups[-1].append((quads, scale, offset, c, g.bits))
    return groups


def _one_trip(p: Problem, s: DotSchedule) -> bool:
    """Whether a lane's direct walk over K is one trip (K of at most 32 x unroll runs)."""
    return p.k // p.run <= LANES * run_unroll(p, s)


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
    (None without a row norm). Int8 rows (`p.q8`) keep QuantizeI8's codes and scales and
    no f32 sums (`gemv_int` takes d * sum_q)."""
    blocks, width = p.k // INT_BLOCK, INT_BLOCK // INT_EACH
    per = _codes_per_word(p)
    row = _row_words(p.k, per)
    qa = kb.shared("act_q", DType.U32, len(ms) * row)
    qd = kb.shared("act_d", DType.F32, len(ms) * blocks)
    qn = kb.shared("act_n", DType.I32, len(ms) * blocks)
    qx = kb.shared("act_x", DType.F32, len(ms) * blocks) if sums and not p.q8 else None
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
            if p.q8:
                scale = kb.let("d", amax / f32(float(Q8_MAX)))
                qs = [kb.let("q", quantize_i8(x, scale, kb.let).cast(DType.I32)) for x in vals]
            else:
                scale = amax * f32(1.0 / 32767.0)
                inv = kb.let("inv", Sel(ge(f32(0.0), amax), f32(0.0), f32(32767.0) / amax))
                qs = [kb.let("q", (x * inv + f32(MAGIC)).bitcast(DType.I32) - i32(MAGIC_BITS))
                      for x in vals]
            total = qs[0]
            for q in qs[1:]:
                total = total + q
            sq = kb.reduce("sq", ReduceOp.Sum, total, width)
            if qx is not None:
                xsum = vals[0]
                for x in vals[1:]:
                    xsum = xsum + x
                sx = kb.reduce("sx", ReduceOp.Sum, xsum, width)
            bits, mask = 32 // per, u32((1 << (32 // per)) - 1)
            words = []
            for w in range(INT_EACH // per):
                word = qs[w * per].bitcast(DType.U32) & mask
                for i in range(1, per):
                    code = qs[w * per + i].bitcast(DType.U32)
                    word = word | ((code & mask) if i < per - 1 else code) << u32(bits * i)
                words.append(word)
            with kb.if_(ix.lt(c, i32(p.k // INT_EACH))):
                pair = ix.mul(c, INT_EACH // per)
                at = kb.let("qw", ix.add(ix.add(pair, ix.div(pair, INT_PAD)), j * row))
                for i, word in enumerate(words):
                    kb.store(qa, ix.add(at, i), word)
                with kb.if_(ix.eq(ix.mod(c, width), i32(0))):
                    blk = ix.add(ix.div(c, width), j * blocks)
                    kb.store(qd, blk, scale)
                    kb.store(qn, blk, sq)
                    if qx is not None:
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


def _int_trips(kb, p: Problem, plan: RunPlan, lane, b, ns, ms, s: DotSchedule):
    """Per trip: slots (k0 to decode at, absolute k of the run, None or the I32 mask of a
    slot past K) and decode(t, n, k0) -> [IntGroup]: lanes take runs lane + 32u; from the
    weight's own words (one trip of clamped runs where K allows, `_one_trip`), or
    from the staged weight tile (`plan.words`, whole trips): then the generator first
    yields None once the first trip's loads are issued (the caller quantizes its rows
    meanwhile), and each trip stores the words held in registers, loads the next trip's
    into them while the lanes compute, and ends at a barrier so the next store waits for
    every read."""
    unroll, runs = run_unroll(p, s), p.k // p.run
    direct = lambda t, n, k0: p.w_int(b, n, k0)  # noqa: E731
    if plan.words is None and _one_trip(p, s):  # clamped runs, masked (ok) where past K
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
        for items in unrolled(kb, lane, 0, runs, unroll):
            k0s = [kb.let("k0", ix.mul(r, p.run)) for r in items]
            yield [(k0, k0, None) for k0 in k0s], direct
        return
    fetch, put, decode = weight_tile(kb, p, plan, lane, b, ms[0], ns,
                                     reader=lambda k0, load: p.w_int(b, i32(0), k0, load))
    step = LANES * unroll * p.run
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
