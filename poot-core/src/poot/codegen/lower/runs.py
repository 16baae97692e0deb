"""The GEMV's walks along K that several schedules share: element by element, and packed
weights a run of consecutive k at a time, with the shared tiles that stage them.

Packed weights are decoded a run at a time (`Problem.w_run`, the format's `decode_run`):
adjacent lanes take adjacent runs, each run's words and scales are loaded once, and a scale
shared by a part of the run multiplies its sum. Where the weight's words lie in K order
(`Problem.w_chunks`), each group first copies the words of its trip's runs to shared
memory, consecutive lanes reading consecutive words, and the lanes decode their runs from
that copy (`weight_tile`, which the integer GEMV reads too). Activations a run apart per
lane are staged through a shared tile by the whole workgroup (`_staged_trips`).
"""
from __future__ import annotations

from dataclasses import dataclass

from poot.codegen import index as ix
from poot.codegen.expr import Const, Expr, Load, Sel, i32
from poot.codegen.lower.problem import Problem
from poot.codegen.lower.schedule import LANES, DotSchedule
from poot.codegen.program import local_index
from poot.dtypes import DType


@dataclass(frozen=True)
class RunPlan:
    """How the GEMV walks runs: `width` columns per group, `groups` groups per workgroup,
    `span` elements of each run's activations per staging phase (None: activations read
    where they are), `words` role -> words per column and trip of staged weights (None:
    each lane loads its runs' words). The rows GEMV uses `width`, `groups` and `unroll`
    (elements per lane and trip); `integer`: the integer GEMV (`int_gemv.int_plan`)."""

    width: int
    groups: int
    unroll: int
    span: int | None = None
    words: dict | None = None
    integer: bool = False
    rows: int | None = None       # rows per group (None: all)
    split: int = 1                # warps per group (the rows GEMV's K split over them)
    quads: bool = False           # the staged tile read four words a load (schedule.quads)


def run_plan(p: Problem, rows: int, s: DotSchedule) -> RunPlan:
    """Staged weights where the format lays its words out in K order: a lane's run of 4-bit
    Q4_0 is 9 words, so lanes loading their own runs read words 36 bytes apart per load
    and 9 loads re-touch the same sectors (load/store-bound); copied by the group,
    consecutive lanes read consecutive words. Their tile and the activation tile share
    `s.shared_bytes`: `s.run_columns` columns per group if they fit (fewer shared loads of
    activations per weight), then the most groups per workgroup (at least half of
    `s.groups` columns, so each staged activation serves several). Else activations alone
    are staged with `s.run_columns` columns per group (each activation a lane reads from
    the tile then serves that many weight rows: one shared load per element was a large
    share of a 4-bit weight's instructions)."""
    if (p.w_run is None or p.run <= 1 or (p.w_pair is not None and p.k % 2 == 0)
            or p.w_per_row or p.batch > 1):    # nothing shared across the workgroup
        return RunPlan(1, s.groups, s.unroll)
    per = LANES * run_unroll(p, s)
    # Rows shorter than one whole trip (SmolLM2's 576 and 1536) are latency-bound: the
    # staging's barrier and shared round trip cost more than coalescing gains there.
    words = trip_words(p, per) if p.k >= per * p.run else None
    groups_options = (s.groups, s.groups // 2, s.groups // 4)
    options = [(w, g) for w in (s.run_columns, 1) for g in groups_options
               if w * g >= s.groups // 2] if words else []
    for width, groups in options:
        span = _stage_span(p, rows, per, groups,
                           s.shared_bytes - 4 * groups * width * pitch(words))
        if span is not None and span >= min(s.min_span, p.run):
            return RunPlan(width, groups, s.unroll, span, words)
    span = _stage_span(p, rows, per, s.groups, s.shared_bytes)
    if span is None:
        return RunPlan(1, s.groups, s.unroll)
    return RunPlan(s.run_columns, s.groups, s.unroll, span)


def run_unroll(p: Problem, s: DotSchedule) -> int:
    """Runs a lane decodes per trip: `s.run_trip` elements' worth."""
    return max(1, s.run_trip // p.run)


def trip_words(p: Problem, per: int, quads: bool = False) -> dict | None:
    """role -> words of one row that a trip of `per` runs reads (its K range, whole chunks
    of every role), or None."""
    span = per * p.run
    if not p.w_chunks or any(span % e or p.k % e for _, e, _ in p.w_chunks.values()):
        return None
    pad = chunk_pad(p, quads)
    return {role: span // e * (w + pad) for role, (_, e, w) in p.w_chunks.items()}


def chunk_pad(p: Problem, quads: bool = False) -> int:
    """Tile words after each chunk: 1 where that makes an even chunk odd, so lanes whose
    runs lie in different chunks read the same place of theirs from distinct banks (Q4_K:
    4 runs per 36-word block read 4-way conflicted, 37 words apart none). Only for one role
    whose chunks hold whole runs (a run's words stay contiguous in the tile), and not
    where the tile is read by `quads` (a 36-word pitch keeps them apart)."""
    if len(p.w_chunks) != 1 or quads:
        return 0
    ((_, e, w),) = p.w_chunks.values()
    return 1 if w % 2 == 0 and e % p.run == 0 else 0


def quad_chunks(p: Problem) -> bool:
    """Whether the weight is one role of chunks of whole runs and whole 16-byte spans, a
    chunk's words 4-aligned wherever the tile puts it (`DotSchedule.quads`)."""
    if len(p.w_chunks) != 1:
        return False
    ((_, e, w),) = p.w_chunks.values()
    return w % 4 == 0 and e % p.run == 0


def pitch(words: dict) -> int:
    """Tile words per column and trip (the roles one after another)."""
    return sum(words.values())


def unrolled(kb, lane, start: int, stop: int, unroll: int, lanes: int = LANES):
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


def gemv_elements(kb, p: Problem, lane, b, n, ms, accs, start: int, unroll: int):
    """One weight element at a time, k = start .. K - 1 (f32, odd K, a packed weight without
    runs or past its last whole run), `unroll` per lane and trip."""
    for slots in unrolled(kb, lane, start, p.k, unroll):
        shared = None if p.w_per_row else kb.let_shared("w", [p.w(b, ms[0], n, k)
                                                             for k in slots])
        for u, k in enumerate(slots):
            for acc, m in zip(accs, ms, strict=True):
                wk = shared[u] if shared is not None else p.w(b, m, n, k)
                kb.assign(acc, acc + p.a(b, m, k) * wk)


def gemv_runs(kb, p: Problem, plan: RunPlan, lane, b, ns, ms, accs, s: DotSchedule):
    """Packed weights, a run of `p.run` consecutive k per lane and slot, for columns `ns`
    (accs[t][j]: column t, row j): the words and scales of every run in flight are loaded
    once (let_shared binds them first), then each part adds scale * sum(a * value) +
    offset * sum(a) per row, each activation read once for all columns. With an offset and
    several rows it is cheaper to decode w = scale * value + offset once and share it; K
    past the last whole run goes element by element."""
    runs = p.k // p.run
    unroll = run_unroll(p, s)
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
            gemv_elements(kb, p, lane, b, n, ms, column, runs * p.run, s.unroll)


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
    """Per trip of `unrolled` runs: slots (k0, None), one phase whose activations are
    read where they are, and decode(t, n, k0) from the weight's own words."""
    for items in unrolled(kb, lane, 0, runs, unroll):
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
    distinct banks. With `plan.words` the weights' words are staged first (`weight_tile`)
    and k0 counts from the trip's start. Whole trips loop; a last partial trip follows, its
    missing slots dropped or masked (ok) and their runs clamped."""
    span = plan.span
    per, threads = LANES * unroll, LANES * plan.groups
    row, step = per * (span + 1), threads // span      # tile row; runs per staging store
    tile = kb.shared("tile_a", p.acc, len(ms) * row)
    li = local_index()
    spot = kb.let("spot", ix.add(ix.mul(ix.div(li, span), span + 1), ix.mod(li, span)))
    src = kb.let("src", ix.add(ix.mul(ix.div(li, span), p.run), ix.mod(li, span)))
    at = ix.mul(lane, span + 1)                          # a lane's run in the tile
    stage = None
    if plan.words is not None:
        fetch, put, decode_tile = weight_tile(kb, p, plan, lane, b, ms[0], ns)

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
                        kb.store(tile, ix.add(spot, j * row + s * step * (span + 1)),
                                 p.a(b, m, k))
                kb.barrier()
                yield lo, lo + span, lambda j, u, i, lo=lo: tile[
                    ix.add(at, j * row + u * LANES * (span + 1) + i - lo)]
                kb.barrier()
        return slots, phases, decode

    full = runs // per
    if full:
        with kb.for_("kc", 0, full * per * p.run, per * p.run) as kc:
            yield trip(kc, per)
    if full * per < runs:
        kc0 = full * per * p.run
        yield trip(i32(kc0), runs - full * per, kc0)


def weight_tile(kb, p: Problem, plan: RunPlan, lane, b, m, ns, reader=None):
    """A shared tile of each group's columns' weight words for one trip, as (fetch, put,
    decode): fetch(kc, kc0, bind) loads the trip from k = kc on (kc0: its value in the last,
    partial trip, whose words are clamped to the row), put(copies) stores them to the tile
    and waits at a barrier, decode(t, n, k0) decodes a run from the copy. Load s of
    lane l reads word 32s + l of a role's span (consecutive lanes, consecutive words); the
    lanes then read their runs' words from the tile: a run of R words per lane is R apart,
    conflict-free when R is odd (Q4_0: 9, Q8_0: 17, Q4_1: 5); every other format reads its
    runs' words in a pattern of its own (`chunk_pad`). The copy is read (decoded) before
    the activation phases, whose barriers keep the next trip's copy after it. `reader(k0,
    load)` decodes a run from the copy (default: `p.w_run` of row 0)."""
    if reader is None:
        reader = lambda k0, load: p.w_run(b, m, i32(0), k0, load=load)  # noqa: E731
    per, pad = pitch(plan.words), chunk_pad(p, plan.quads)       # words a column and trip
    tile = kb.shared("tile_w", DType.U32, plan.groups * plan.width * per)
    mine = kb.let("wt", ix.mul(ix.div(local_index(), LANES), plan.width * per))
    offsets, at = {}, 0
    for role, count in plan.words.items():
        offsets[role], at = at, at + count

    def fetch(kc, kc0, bind):
        """The trip's word loads, bound by `bind(name, load)`: (tile spot, word, mask)."""
        copies = []
        for t, n in enumerate(ns):
            for role, (buf, e, w) in p.w_chunks.items():
                row, count = p.k * p.parts // e * w, plan.words[role] // (w + pad) * w
                k = kc if p.parts == 1 else ix.add(kc, ix.mul(b, p.k))
                start = kb.let("ws", ix.add(ix.mul(n, row), ix.mul(ix.div(k, e), w)))
                limit = count if kc0 is None else min(count, row - kc0 // e * w)
                for s in range(0, count, LANES):     # all loads in flight, then the stores
                    i = ix.add(lane, s)
                    at = i if s + LANES <= limit else ix.minimum(i, i32(limit - 1))
                    word = bind("wv", Load(buf, ix.add(start, at), DType.U32))
                    spot = ix.add(i, ix.div(i, w)) if pad else i
                    copies.append((ix.add(mine, ix.add(spot, t * per + offsets[role])), word,
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

    def decode(t, n, k0):
        first = ix.i32(t * per)
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
