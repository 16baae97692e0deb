"""The rows GEMV: a decode batch (more rows than the GEMV holds, up to
`DotSchedule.batch_rows`) over one weight.

The GEMV's groups, a few columns each, with lanes striding along K one element at a time,
so every activation load is coalesced across the lanes and serves all the group's columns,
and each weight element is decoded once for the group's rows: all of them over wide N, a
tile of rows over narrow N (a workgroup's groups take one column's row tiles in turn;
`schedule.RowsRule`). A group's many dot products finish by one reduce-scatter per 32 of
them where the target has it (each lane then stores one), else by a butterfly each. The
tiled GEMM's 16x16 tiles would leave such small problems a few workgroups looping over K
through barriers: latency-bound.
"""
from __future__ import annotations

from poot.codegen import index as ix
from poot.codegen.expr import i32
from poot.codegen.lower.problem import Problem
from poot.codegen.lower.runs import RunPlan, unrolled
from poot.codegen.lower.schedule import LANES, DotSchedule
from poot.codegen.program import local_index
from poot.ir.ops import ReduceOp


def rows_plan(p: Problem, s: DotSchedule) -> RunPlan:
    """The rows GEMV's columns per group (one batch per group: N a multiple of them), rows
    per group and elements per lane and trip (`unroll`). Narrow problems (few columns, so
    few groups) are bound by each group's chain of trips and have too few warps to hide
    it: with `rule` = `s.rows`, `rule.tile` rows a group (a batch's rows over several
    groups: more warps, each with a shorter chain of loads and multiply-adds per element),
    `rule.columns` columns a group past one tile of rows (each activation load serves them
    all; one tile keeps one column, for warps), K split over `split` warps a group (each
    warp a shorter chain again; the warps' sums meet in shared memory), and the most
    elements per trip that divide K's whole lane strides, so short rows (SmolLM2's K =
    576) take one trip. Wide ones have groups enough to hide latency: every row and
    `s.rows_wide_columns` columns a group (each activation load serves them all) in trips
    of `s.unroll`."""
    rule = s.rows
    wide = p.batch * p.n >= s.rows_wide_n
    tiles = -(-p.m // rule.tile)
    many = p.m > rule.tile and p.n // rule.columns * tiles >= rule.min_groups
    width = s.rows_wide_columns if wide else rule.columns if many else 1
    width = width if p.batch == 1 and p.n % width == 0 else 1
    if wide:        # groups enough already: row tiles would only decode each weight again
        return RunPlan(width, s.rows_groups, s.unroll)
    warps = p.batch * p.n // width * tiles
    accs = width * min(p.m, rule.tile)
    split = 1
    while (2 * split <= rule.split and 2 * split * warps <= rule.warps
           and 2 * split * accs <= rule.accs and p.k >= 2 * split * LANES * rule.min_trip):
        split *= 2
    strides = p.k // (LANES * split)
    unroll = max((u for u in range(1, s.rows_unroll + 1) if strides % u == 0), default=1)
    return RunPlan(width, s.rows_groups * split, unroll, rows=rule.tile, split=split)


def gemv_columns(kb, p: Problem, lane, b, ns, ms, accs, unroll: int, lanes: int = LANES):
    """Many rows (accs[t][j]: column t, row j), one weight element of each column at a
    time, `unroll` per lane and trip: the lanes' activations of one row and k are adjacent
    (one coalesced load, bound once for every column), and each weight is decoded once
    (bound) for every row. Packed weights decode element by element here: their runs would
    have each lane read its own span of every row's activations, a line per lane and load.
    `lanes` lanes (a warp or several) share each dot product."""
    for slots in unrolled(kb, lane, 0, p.k, unroll, lanes):
        ws = iter([kb.let("w", x) for x in kb.let_shared(
            "w", [p.w(b, ms[0], n, k) for n in ns for k in slots])])
        ws = [[next(ws) for _ in slots] for _ in ns]
        for u, k in enumerate(slots):
            for j, m in enumerate(ms):
                a = kb.let("a", p.a(b, m, k)) if len(ns) > 1 else p.a(b, m, k)
                for t, column in enumerate(accs):
                    kb.assign(column[j], column[j] + a * ws[t][u])



def split_sums(kb, p: Problem, accs, lanes: int, warps: int):
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


def scattered_sums(kb, p: Problem, flat: list, lanes: int, warps: int):
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
