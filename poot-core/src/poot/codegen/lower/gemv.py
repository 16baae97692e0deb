"""The GEMV (few rows: decode) and the kernel skeleton it shares with the rows GEMV and
the integer GEMV.

One 32-thread group per output column n. Its lanes stride along K, so each group reads
one weight row with coalesced loads; all rows m reuse the weight value from registers; one
cooperative reduction of width 32 (a warp or subgroup) finishes each dot product. Weights
of 16 bits are read as whole U32 words, two values per load (`Problem.w_pair`), a
column's K split over several warps where few columns would leave the memory pipe
underfilled. Packed weights walk runs (`poot.codegen.lower.runs`), or take the integer
GEMV on a DOT2 target (`poot.codegen.lower.int_gemv`); a decode batch takes the rows GEMV
(`poot.codegen.lower.rows_gemv`). Weights that differ per row (IndexedMatMul, MoE) take
one group per output element.

A gated contraction (`Problem.pair`: GatedContraction, a SwiGLU over a stacked gate|up
result) gives the column slots 2i and 2i + 1 the columns i and N/2 + i, so each workgroup
holds whole pairs and joins them after its reductions (`_join_pairs`).

The 16-bit GEMV (and the integer GEMV where its words are staged or K is one trip) loads
its first trip's weights before the kernel's AwaitInputs (`DotSchedule.early_loads`), so on
a target whose launches overlap, that latency hides under the kernel before; the runtime
overlaps such a launch only where those operands are plan constants. The rows GEMV does
not (at 32 rows it made the step slower: docs/performance.md).
"""
from __future__ import annotations

from poot.codegen import index as ix
from poot.codegen.expr import Expr, Load, f32, i32
from poot.codegen.lower import rows_gemv
from poot.codegen.lower.int_gemv import gemv_int, int_plan
from poot.codegen.lower.problem import Problem, Rows
from poot.codegen.lower.runs import RunPlan, gemv_elements, gemv_runs, run_plan, unrolled
from poot.codegen.lower.schedule import LANES, DotSchedule
from poot.codegen.program import local_index
from poot.codegen.target import REDUCE_SCATTER, WIDE_LOADS
from poot.dtypes import DType
from poot.errors import UnsupportedOp
from poot.ir.ops import ReduceOp


def _plan(p: Problem, many_rows: bool, features, s: DotSchedule) -> tuple[RunPlan, int]:
    """`gemv_kernel`'s plan for `p` and the warps a dot product takes."""
    rows = p.m if not p.w_per_row else 1
    if many_rows:
        plan = rows_gemv.rows_plan(p, s)
    else:
        plan = int_plan(p, rows, features, s) or run_plan(p, rows, s)
    columns = p.batch * p.n * (p.m if p.w_per_row else 1)
    return plan, _words_split(p, columns, s) if words(p, many_rows) else plan.split


def _tiles(p: Problem, plan: RunPlan) -> tuple[int, int]:
    """(rows per group, groups sharing one set of columns: one per tile of rows)."""
    rows = p.m if not p.w_per_row else 1
    tile = min(plan.rows or rows, rows)
    return tile, -(-rows // tile)


def gemv_slots(p: Problem, features, s: DotSchedule, many_rows: bool = False) -> int:
    """Columns one workgroup of `gemv_kernel` computes for every row; 0 where its groups'
    row tiles do not make whole columns in one workgroup."""
    plan, split = _plan(p, many_rows, features, s)
    groups, (_, chunks) = plan.groups // split, _tiles(p, plan)
    return plan.width * groups // chunks if groups % chunks == 0 else 0


def words(p: Problem, many_rows: bool = False) -> bool:
    """Whether the GEMV reads `p`'s weight as 16-bit pairs, a U32 word at a time."""
    return not many_rows and p.w_pair is not None and not p.w_per_row and p.k % 2 == 0


def gemv_kernel(p: Problem, kb_factory, declare, features: frozenset, s: DotSchedule,
                many_rows: bool = False):
    """The GEMV schedules; `many_rows`: the rows GEMV (element walk, several columns);
    `features`: the target's (the integer GEMV where it declares DOT2); `s` its tuning."""
    rows = p.m if not p.w_per_row else 1        # rows sharing one weight column per group
    columns = p.batch * p.n * (p.m if p.w_per_row else 1)
    scatter = many_rows and REDUCE_SCATTER in features
    plan, split = _plan(p, many_rows, features, s)
    tile, chunks = _tiles(p, plan)              # rows per group, groups per column set
    if p.q8 and not plan.integer:     # dot.contraction_program rounds such rows first
        raise UnsupportedOp("int8 rows reach the GEMV only where it quantizes them (the "
                            "integer GEMV)", op="Q8PackedContraction")
    width = plan.width                          # columns per group
    wordwise = words(p, many_rows)
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
        rows_gemv.gemv_columns(kb, p, lane, b, ns, ms, accs, plan.unroll, lanes)
    elif wordwise:
        pairs = s.pairs and WIDE_LOADS in features
        dens = _gemv_words(kb, p, lane, b, ns[0], ms, accs[0], s, lanes, pairs)
    elif plan.integer:
        dens = gemv_int(kb, p, plan, lane, b, ns, ms, accs, s)
    elif p.w_run is not None and p.run > 1:
        gemv_runs(kb, p, plan, lane, b, ns, ms, accs, s)
    else:
        gemv_elements(kb, p, lane, b, ns[0], ms, accs[0], 0, s.unroll)
    slots = groups // chunks * width            # a gated contraction's, in a workgroup
    if scatter:
        pairs = None if p.pair is None else _Pairs(kb, p, blk, slots)
        flat = [accs[t][j] for j in range(len(ms)) for t in range(len(cols))]
        for i, total, holds in rows_gemv.scattered_sums(kb, p, flat, lanes, plan.groups):
            t, j = ix.mod(i, len(cols)), ix.div(i, len(cols))
            col = kb.let("col", ix.add(ix.mul(group, len(cols)), t)) if len(cols) > 1 \
                else group
            m = ix.add(first, j) if chunks > 1 else j
            ok = ix.both(holds, ix.both(ix.lt(col, i32(columns)), ix.lt(m, i32(rows))))
            with kb.if_(ok):
                if pairs is not None:
                    pairs.put(col, m, total)
                else:
                    p.store(kb, b, kb.let("m", m), kb.let("n", ix.mod(col, p.n)), total)
        if pairs is not None:
            pairs.join(LANES * plan.groups)
        return kb.finish()
    if p.row_norm is not None and dens is None:
        dens = row_roots(kb, p, b, ms, LANES * plan.groups)
    if many_rows and lanes > LANES:
        totals = rows_gemv.split_sums(kb, p, accs, lanes, plan.groups)
    else:
        totals = [[kb.reduce("dot", ReduceOp.Sum, acc, lanes) for acc in column]
                  for column in accs]
    if p.pair is not None:
        pairs = _Pairs(kb, p, blk, slots)
        for col, sums in zip(cols, totals, strict=True):
            with kb.if_(ix.both(ix.eq(lane, i32(0)), ix.lt(col, i32(columns)))):
                for j, total in enumerate(sums):
                    value = total if dens is None else total / dens[j]
                    if chunks * tile > rows and j:      # the last tile's spare rows
                        with kb.if_(ix.lt(ix.add(first, j), i32(rows))):
                            pairs.put(col, ix.add(first, j), value)
                    else:
                        pairs.put(col, ix.add(first, j) if chunks > 1 else i32(j), value)
        pairs.join(LANES * plan.groups)
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


class _Pairs:
    """A gated contraction's outputs: the workgroup's `slots` columns (2i, 2i + 1: the
    pairs i, N/2 + i) of every row meet in shared memory (`put`), then one thread per
    output joins a pair (`join`)."""

    def __init__(self, kb, p: Problem, blk, slots: int):
        self.kb, self.p, self.slots = kb, p, slots
        self.sums = kb.shared("pair_sums", p.acc, slots * p.m)
        self.first = kb.let("s0", ix.mul(blk, slots))

    def put(self, col, m, total) -> None:
        at = ix.add(ix.mul(ix.sub(col, self.first), self.p.m), m)
        self.kb.store(self.sums, at, total)

    def join(self, threads: int) -> None:
        kb, p, rows = self.kb, self.p, self.p.m
        kb.barrier()
        with kb.for_("e", local_index(), self.slots // 2 * rows, threads) as e:
            pair, m = kb.let("pr", ix.div(e, rows)), kb.let("m", ix.mod(e, rows))
            i = kb.let("i", ix.add(ix.div(self.first, 2), pair))
            with kb.if_(ix.lt(i, i32(p.n // 2))):
                at = ix.add(ix.mul(pair, 2 * rows), m)
                p.pair(kb, m, i, kb.let("lo", self.sums[at]),
                       kb.let("hi", self.sums[ix.add(at, rows)]))


def _words_split(p: Problem, columns: int, s: DotSchedule) -> int:
    """Warps per dot product of a 16-bit GEMV (a power of two, at most `s.groups`): with
    one warp per column, few columns leave too few loads in flight to fill the memory pipe
    (the K and V projections of an 8B model, 1024 columns), so each column's K is split
    across warps while there are fewer than `s.split_warps` warps and every lane keeps at
    least 2 * `s.unroll` words."""
    count, split = p.k // 2, 1
    while (split < s.groups and columns * split < s.split_warps
           and count >= LANES * 2 * split * 2 * s.unroll):
        split *= 2
    return split


def _gemv_words(kb, p: Problem, lane, b, n, ms, accs, s: DotSchedule, lanes: int,
                pairs: bool):
    """16-bit weights, two per U32 word, over `lanes` lanes per column: each lane reads
    whole words, 2 * `s.unroll` in flight on long rows (few columns of long rows need more
    loads in flight per lane to fill the memory pipe). `pairs`: a word's two activations
    in one 8-byte load (`Activations`)."""
    words_per_row = p.k // 2
    unroll = 2 * s.unroll if words_per_row >= 4 * lanes * 2 * s.unroll else s.unroll
    act = Activations(kb, p, b, ms, pairs)

    def word(name, at):          # one load a word, both halves read from it
        return kb.let("wd", Load(name, at, DType.U32))

    def load(slots):
        return [tuple(kb.let("w", x) for x in p.w_pair(b, n, kw, load=word)) for kw in slots]

    def use(slots, held):
        for kw, (w0, w1) in zip(slots, held, strict=True):
            k0 = kb.let("k0", ix.mul(kw, 2))
            for j, acc in enumerate(accs):
                a0, a1 = act.pair(j, k0)
                kb.assign(acc, acc + a0 * w0 + a1 * w1)
    _early_walk(kb, lane, words_per_row, unroll, lanes, load, use, s.early_loads)
    return act.roots(lanes)


class Activations:
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


def row_roots(kb, p: Problem, b, ms, threads: int) -> list[Expr]:
    """Each row's sqrt(sum x^2 / K + eps) for a GEMV whose walk takes no sums of squares
    (packed runs, elements): the workgroup's `threads` stride over the rows' K once more
    and reduce together. A row is K floats that every workgroup reads anyway, so this costs
    a cached reread, not a kernel and a barrier of the norm's own."""
    norm, sums = p.row_norm, [kb.var("ss", f32(0.0)) for _ in ms]
    with kb.for_("j", local_index(), p.k, threads) as j:
        for ss, m in zip(sums, ms, strict=True):
            x = kb.let("x", norm.x(b, m, j))
            kb.assign(ss, ss + x * x)
    return [kb.let("den", norm.den(kb.reduce("ss", ReduceOp.Sum, ss), p.k)) for ss in sums]


def _early_walk(kb, lane, stop: int, unroll: int, lanes: int, load, use, early: bool):
    """`runs.unrolled`'s walk as load(slots) -> held, then use(slots, held), with the
    first whole trip's loads (weights only) issued before the kernel's AwaitInputs where
    `early`, so they overlap the kernel before this one (K shorter than a trip: none)."""
    start = 0
    if early and stop >= lanes * unroll:
        first = [ix.add(lane, lanes * u) for u in range(unroll)]
        held = load(first)
        kb.await_inputs()
        use(first, held)
        start = lanes * unroll
    for slots in unrolled(kb, lane, start, stop, unroll, lanes):
        use(slots, load(slots))
