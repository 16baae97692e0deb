"""Attention: softmax(q k^T * scale + mask) v with GQA, online softmax, no score matrix.

Both schedules share one piece (`Row`): a 32-lane group owns one query row; its
lanes split the head dimension, so a score is one width-32 cooperative sum (a run
of KEYS of them in flight at once, DECODE_KEYS in decode), and each lane keeps its
slice of the running output in registers, rescaled once per run of keys (online
softmax).

* decode (T = 1): one workgroup per query row and KV split; its groups take runs
  of keys in turn and merge through shared memory; with few rows and more keys than
  DECODE_TRIPS runs of its groups, the keys are split across workgroups too
  (split-KV) and a second kernel merges the splits. Where the target launches wide
  workgroups a decode workgroup has DECODE_WARPS groups and takes up to DECODE_TRIPS
  runs, so a row's keys up to a cache of 1024 take one kernel.
* prefill (T > 1): query-block tiles. A workgroup takes WARPS query rows that
  share one KV head (GQA heads and positions together); K and V tiles of up to
  32 keys are staged once in shared memory and consumed by every row of
  the block, so K/V are read from memory once per block, not once per row.

TokenMajorAttention runs them with its query and output rows token by token
(`Shape.row_start`). PagedAttention runs the same kernels with one change: a key's K and
V rows are read from the pool at the slot its sequence's slot map names (`Keys`),
instead of from a gathered [B, Hkv, S, D] copy. SinkAttention runs them too: its head's
sink joins the softmax where the output is written (`Shape.divide`), once per row after
every key (and split) is merged.
"""
from __future__ import annotations

import contextlib
import math

from poot.codegen import index as ix
from poot.codegen.expr import Const, Expr, Load, Sel, Un, f32, i32, maximum
from poot.codegen.lower.base import Sig, lowers
from poot.codegen.lower.rope import rotated
from poot.codegen.program import SCRATCH, Access, BufferParam, KernelProgram, local_index
from poot.dtypes import DType
from poot.errors import LimitExceeded
from poot.ir.ops import (
    Attention,
    FreshKVAttention,
    PagedAttention,
    ReduceOp,
    SinkAttention,
    TokenMajorAttention,
    UnaryOp,
)

F32 = DType.F32
I32 = DType.I32
#: FreshKVAttention's operands: the new key and value rows, cos and sin, the write index
FRESH_K, FRESH_V, FRESH_TABLES, FRESH_INDEX = 4, 5, (6, 7), 8
LANES = 32
WARPS = 4
KEYS = 8          # keys one 32-lane group scores per loop trip (independent chains in flight)
#: decode's keys per group and trip: a split of 64 keys is one trip of its 4 groups, one
#: dependent K/V round trip instead of two (docs/performance.md, 2026-12-04 21:50 UTC)
DECODE_KEYS = 16
SHARED_BYTES = 16 * 1024   # prefill K/V tiles stay within this (WebGPU devices have 16-32 KiB)
NEG_INF = Const(float("-inf"), F32)
#: decode walks each KV split, and prefill each workgroup's keys, only up to the last live
#: key (False: all of them, every trip masked past the position; kept for A/B benches)
REACH = True


def exp(x: Expr) -> Expr:
    return Un(UnaryOp.Exp, x)


def finite_or_zero(m: Expr) -> Expr:
    """The running max used as the exponent base: 0 while nothing was seen (-inf),
    so exp(-inf - base) = 0 instead of NaN."""
    return ix.Sel(ix.eq(m, NEG_INF), f32(0.0), m)


#: decode splits the keys across workgroups up to about this many workgroups ...
SPLIT_GROUPS = 512
#: ... where a row has more keys than this many trips of its workgroup's groups
DECODE_TRIPS = 8
#: groups of a decode workgroup where the target launches wide workgroups (else WARPS)
DECODE_WARPS = 8


def choose_splits(rows: int, keys: int, per_split: int) -> int:
    """Split the keys across workgroups when there are too few rows to fill a GPU and a
    row has more than `per_split` keys (SPLIT_GROUPS: the per-key dependency chain of a
    32-lane group is long, so more groups in flight is what helps, but each split costs
    the merge kernel)."""
    if rows >= SPLIT_GROUPS:
        return 1
    return max(1, min(math.ceil(keys / per_split), SPLIT_GROUPS // max(rows, 1)))


@lowers(Attention, FreshKVAttention, PagedAttention, SinkAttention, TokenMajorAttention)
def lower_attention(sig: Sig) -> KernelProgram:
    from poot.codegen.target import WIDE_WORKGROUPS

    q = sig.type(0)
    s = Shape(sig).s
    if Shape(sig).t > 1:
        return KernelProgram((_block_kernel(sig),))
    rows = math.prod(q.shape[:-1])
    wide = WIDE_WORKGROUPS in sig.features    # narrow workgroups split at one trip each
    warps = DECODE_WARPS if wide else WARPS
    splits = choose_splits(rows, s, warps * DECODE_KEYS * (DECODE_TRIPS if wide else 1))
    chunk = math.ceil(s / splits)
    scratch = ()
    kernels = [_partial_kernel(sig, rows, splits, chunk, warps)]
    if splits > 1:
        scratch = (_part_acc(sig, rows, splits), _part_ml(rows, splits))
        kernels.append(_merge_kernel(sig, rows, splits))
    return KernelProgram(tuple(kernels), scratch=scratch)


def _part_acc(sig, rows, splits):
    return BufferParam("part_acc", F32, Access.READ_WRITE, rows * splits * sig.out.shape[-1],
                       SCRATCH)


def _part_ml(rows, splits):
    return BufferParam("part_ml", F32, Access.READ_WRITE, rows * splits * 2, SCRATCH)


class Shape:
    """The attention operands' sizes (the mask is operand `mask`; a PagedAttention's is
    operand 4, after the slot map)."""

    def __init__(self, sig: Sig, mask: int = 3):
        self.paged = isinstance(sig.op, PagedAttention)
        if self.paged:
            mask = 4
        q, k, v, mask_t = (sig.type(i) for i in (0, 1, 2, mask))
        self.q, self.k, self.v, self.mask = q, k, v, mask_t
        self.mask_name = f"in{mask}"
        #: TokenMajorAttention's q and result are [..., T, Hq, D]: rows token by token
        self.tokens_first = isinstance(sig.op, TokenMajorAttention)
        if self.tokens_first:
            *lead, self.t, self.hq, self.d = q.shape
        else:
            *lead, self.hq, self.t, self.d = q.shape
        self.lead = tuple(lead)
        if self.paged:     # k_pool [P, Hkv, D], slot_map [B, S]
            self.hkv, self.s, self.dv = k.shape[1], sig.type(3).shape[1], v.shape[-1]
        else:
            self.hkv, self.s, self.dv = k.shape[-3], k.shape[-2], v.shape[-1]
        self.group = self.hq // self.hkv
        self.dj, self.vj = math.ceil(self.d / LANES), math.ceil(self.dv / LANES)
        self.scale = sig.op.scale
        #: SinkAttention's sinks [Hq] (operand 4), else None
        self.sinks = sig.type(4) if isinstance(sig.op, SinkAttention) else None
        #: FreshKVAttention: q rotated as it is read, the keys at the write index read from
        #: this step's rows (`Keys.load`)
        self.sig, self.fresh = sig, isinstance(sig.op, FreshKVAttention)

    def row_start(self, li, h, ti, width: int) -> Expr:
        """Where query (or output) row (li, h, ti) starts in q (or the result), rows of
        `width` elements."""
        if self.tokens_first:
            return ix.mul(ix.add(ix.mul(ix.add(ix.mul(li, self.t), ti), self.hq), h), width)
        return ix.mul(ix.add(ix.mul(ix.add(ix.mul(li, self.hq), h), self.t), ti), width)

    def divide(self, acc: Expr, lsum: Expr, base: Expr, h) -> Expr:
        """A row's output element: acc / lsum, both relative to exp(base) (the finite
        running max, 0 while nothing was seen); with sinks, head h's sink s joins the
        denominator: acc f / (lsum f + exp(s - top)), top = max(base, s), f = exp(base - top)."""
        if self.sinks is None:
            return acc / lsum
        s = Load("in4", h, self.sinks.dtype).cast(F32)
        top = maximum(base, s)
        f = exp(base - top)
        return acc * f / (lsum * f + exp(s - top))


class Keys:
    """Where key `key` (in range) of sequence `li`, KV head `kvh`, starts in the K and V
    buffers: a row of the gathered [..., Hkv, S, D] operands, or the pool row at the slot
    the slot map (in3) names. FreshKVAttention's keys from the write index on are this
    step's rows instead (`load`)."""

    def __init__(self, kb, a: Shape, li, kvh):
        self.kb, self.a, self.li, self.kvh = kb, a, li, kvh
        self.staged = None
        if not a.paged:
            kvrow = ix.add(ix.mul(li, a.hkv), kvh)
            self.kbase = kb.let("kbase", ix.mul(kvrow, a.s * a.d))
            self.vbase = kb.let("vbase", ix.mul(kvrow, a.s * a.dv))
        if a.fresh:   # clamped as DynamicUpdateSlice's index
            self.index = kb.let("fresh_at", ix.clamp(Load(f"in{FRESH_INDEX}", i32(0), I32),
                                                     0, a.s - a.t))

    def load(self, side: int, start, key, dim) -> Expr:
        """Key `key`'s K (side 0) or V (side 1) element `dim` as f32, its row at `start`."""
        a = self.a
        name, t = ("in1", a.k) if side == 0 else ("in2", a.v)
        cached = Load(name, ix.add(start, dim), t.dtype).cast(F32)
        if not a.fresh:
            return cached
        rel = ix.sub(key, self.index)
        inside = ix.both(ix.ge(rel, i32(0)), ix.lt(rel, i32(a.t)))
        fresh = self.staged[side][dim] if self.staged else \
            self.fresh_row(side, ix.clamp(rel, 0, a.t - 1), dim)
        return Sel(inside, fresh, cached)

    def fresh_row(self, side: int, row, dim) -> Expr:
        """Element `dim` of this step's row `row` as the cache would hold it: the key
        rotated, both rounded to the cache's dtype, as f32."""
        a, sig = self.a, self.a.sig
        coords = list(ix.unravel(self.li, a.lead)) + [self.kvh, row, dim]
        if side == 0:
            y = rotated(self.kb, sig, sig.op.rot, FRESH_K, coords, FRESH_TABLES)
        else:
            new = sig.type(FRESH_V)
            y = Load(f"in{FRESH_V}", ix.ravel(coords, new.shape), new.dtype)
        return y.cast((a.k if side == 0 else a.v).dtype).cast(F32)

    def stage(self, wg: int) -> None:
        """Decode (one new row): that row's K and V, computed once into shared memory by
        the workgroup, which `load` then reads (the caller places the barrier)."""
        kb, a = self.kb, self.a
        rows = (kb.shared("s_fk", F32, a.d), kb.shared("s_fv", F32, a.dv))
        for side, (tile, width) in enumerate(zip(rows, (a.d, a.dv), strict=True)):
            with kb.for_("fe", local_index(), width, wg) as e:
                kb.store(tile, e, self.fresh_row(side, i32(0), e))
        self.staged = rows

    def rows(self, key):
        """(K row start, V row start) of `key`, as let-bound values."""
        kb, a = self.kb, self.a
        if not a.paged:
            return ix.add(self.kbase, ix.mul(key, a.d)), ix.add(self.vbase, ix.mul(key, a.dv))
        slot = kb.let("slot", Load("in3", ix.add(ix.mul(self.li, a.s), key), DType.I32))
        row = kb.let("kvrow", ix.add(ix.mul(slot, a.hkv), self.kvh))
        return ix.mul(row, a.d), ix.mul(row, a.dv)


class Row:
    """One query row owned by one 32-lane group: its q slice, running max, sum and output
    slice (per-thread arrays), updated by runs of keys (KEYS, DECODE_KEYS)."""

    def __init__(self, kb, a: Shape, lane, li, h, ti, row_ok):
        self.kb, self.a, self.lane, self.row_ok = kb, a, lane, row_ok
        self.qreg = kb.local("qreg", F32, a.dj)
        self.acc = kb.local("acc", F32, a.vj)
        qbase = a.row_start(li, h, ti, a.d)
        with kb.for_("jq", 0, a.dj) as j:
            dd = ix.add(lane, ix.mul(j, LANES))
            dc = ix.minimum(dd, i32(a.d - 1))
            if a.fresh:
                val = rotated(kb, a.sig, a.sig.op.rot, 0,
                              list(ix.unravel(li, a.lead)) + [h, ti, dc], FRESH_TABLES)
            else:
                val = Load("in0", ix.add(qbase, dc), a.q.dtype)
            val = val.cast(F32)
            kb.store(self.qreg, j, ix.Sel(ix.both(ix.lt(dd, i32(a.d)), row_ok), val, f32(0.0)))
        with kb.for_("ja", 0, a.vj) as j:
            kb.store(self.acc, j, f32(0.0))
        self.m = kb.var("m", NEG_INF)
        self.lsum = kb.var("lsum", f32(0.0))
        self.mrow = list(ix.unravel(li, a.lead)) + [ix.div(h, a.group), ix.mod(h, a.group), ti]

    def mask_at(self, key):
        c = ix.broadcast_coords(self.mrow + [key], self.a.mask.shape)
        return Load(self.a.mask_name, ix.ravel(c, self.a.mask.shape),
                    self.a.mask.dtype).cast(F32)

    def run(self, keys, valid, k_at, v_at):
        """Consume a run of keys: `keys[i]` (clamped, in range) and `valid[i]` (I32) of each;
        `k_at(i, dim)`, `v_at(i, dim)` read key i's K and V at a (clamped) dimension."""
        kb, a, lane = self.kb, self.a, self.lane
        parts = [kb.var("part", f32(0.0)) for _ in keys]
        with kb.for_("jk", 0, a.dj) as j:
            dk = kb.let("dk", ix.minimum(ix.add(lane, ix.mul(j, LANES)), i32(a.d - 1)))
            qj = kb.let("qj", self.qreg[j])
            for i, part in enumerate(parts):
                kb.assign(part, part + qj * k_at(i, dk))
        scores = []   # independent width-32 reductions, one a key: their shuffles overlap
        for part, key, ok in zip(parts, keys, valid, strict=True):
            dot = kb.reduce("dot", ReduceOp.Sum, part, LANES)
            scores.append(kb.let("score", ix.Sel(ok, dot * f32(a.scale) + self.mask_at(key),
                                                  NEG_INF)))
        m_new = self.m
        for sc in scores:
            m_new = maximum(m_new, sc)
        m_new = kb.let("m_new", m_new)
        base = kb.let("base", finite_or_zero(m_new))
        corr = kb.let("corr", exp(self.m - base))
        ps = [kb.let("p", exp(sc - base)) for sc in scores]
        total = self.lsum * corr
        for p in ps:
            total = total + p
        kb.assign(self.lsum, total)
        with kb.for_("jv", 0, a.vj) as j:
            dvj = kb.let("dvj", ix.minimum(ix.add(lane, ix.mul(j, LANES)), i32(a.dv - 1)))
            out_j = self.acc[j] * corr
            for i, p in enumerate(ps):
                out_j = out_j + p * v_at(i, dvj)
            kb.store(self.acc, j, out_j)
        kb.assign(self.m, m_new)


def _block_kernel(sig: Sig):
    """Prefill: WARPS query rows of one KV head per workgroup, K/V tiles in shared memory."""
    a = Shape(sig)
    per_head = a.group * a.t                       # query rows that read one KV head
    blocks = math.ceil(per_head / WARPS)
    count = math.prod(a.lead) * a.hkv * blocks
    wg = LANES * WARPS
    tile_keys = KEYS * max(1, SHARED_BYTES // (4 * KEYS * (a.d + a.dv)))
    if tile_keys * 4 * (a.d + a.dv) > 48 * 1024:
        raise LimitExceeded(f"Attention head dims {a.d}+{a.dv} need more shared memory than "
                            "a workgroup has", op="Attention")
    tile_keys = min(tile_keys, 4 * KEYS)
    grid, g = ix.launch_groups(count)
    kb = sig.builder(grid, (wg,))
    sig.declare_all(kb)
    sk = kb.shared("s_k", F32, tile_keys * a.d)
    sv = kb.shared("s_v", F32, tile_keys * a.dv)
    lane = kb.let("lane", ix.mod(local_index(), LANES))
    warp = kb.let("warp", ix.div(local_index(), LANES))
    gg = kb.let("g", g)
    with kb.if_(ix.lt(gg, i32(count))):               # uniform: whole workgroups
        blk = kb.let("blk", ix.mod(gg, blocks))
        kvh = kb.let("kvh", ix.mod(ix.div(gg, blocks), a.hkv))
        li = kb.let("l", ix.div(gg, blocks * a.hkv))
        r = kb.let("r", ix.add(ix.mul(blk, WARPS), warp))   # this group's row within the head
        row_ok = kb.let("row_ok", ix.lt(r, i32(per_head)))
        rc = kb.let("rc", ix.minimum(r, i32(per_head - 1)))
        h = kb.let("h", ix.add(ix.mul(kvh, a.group), ix.div(rc, a.t)))
        ti = kb.let("t", ix.mod(rc, a.t))
        row = Row(kb, a, lane, li, h, ti, row_ok)
        at = Keys(kb, a, li, kvh)
        with kb.for_("kt", 0, _block_reach(kb, a, row, lane) if REACH else a.s,
                     tile_keys) as kt:
            for tile, side, width in ((sk, 0, a.d), (sv, 1, a.dv)):
                with kb.for_("e", local_index(), tile_keys * width, wg) as e:
                    key = kb.let("key", ix.add(kt, ix.div(e, width)))
                    kc = ix.minimum(key, i32(a.s - 1))
                    value = at.load(side, at.rows(kc)[side], kc, ix.mod(e, width))
                    kb.store(tile, e, ix.Sel(ix.lt(key, i32(a.s)), value, f32(0.0)))
            kb.barrier()
            with kb.for_("run", 0, tile_keys, KEYS) as run:
                rel = [ix.add(run, i) for i in range(KEYS)]
                keys = [kb.let("key", ix.minimum(ix.add(kt, x), i32(a.s - 1))) for x in rel]
                valid = [ix.lt(ix.add(kt, x), i32(a.s)) for x in rel]
                row.run(keys, valid,
                        lambda i, dk: sk[ix.add(ix.mul(rel[i], a.d), dk)],
                        lambda i, dvj: sv[ix.add(ix.mul(rel[i], a.dv), dvj)])
            kb.barrier()
        with kb.if_(row_ok):
            obase = a.row_start(li, h, ti, a.dv)
            with kb.for_("jo", 0, a.vj) as j:
                dd = kb.let("dd", ix.add(lane, ix.mul(j, LANES)))
                with kb.if_(ix.lt(dd, i32(a.dv))):
                    kb.store("out", ix.add(obase, dd), a.divide(
                        row.acc[j], row.lsum, finite_or_zero(row.m), h).cast(sig.out.dtype))
    return kb.finish()


def _block_reach(kb, a: Shape, row: Row, lane) -> Expr:
    """The keys a prefill workgroup walks: up to the last live key (mask not -inf) of any
    of its rows. Each group scans its own row's mask; the walk past it would only add
    exp(-inf) = 0 terms, so prompts cost their positions, not the cache's capacity."""
    seen = kb.var("seen", i32(0))
    with kb.for_("e", lane, a.s, LANES) as e:
        live = ix.Sel(ix.eq(row.mask_at(e), NEG_INF), i32(0), i32(1))
        kb.assign(seen, maximum(seen, ix.Sel(live, ix.add(e, 1), i32(0))))
    return kb.reduce("reach", ReduceOp.Max, seen)


def _partial_kernel(sig: Sig, rows: int, splits: int, chunk: int, warps: int):
    """Decode: one workgroup per (query row, KV split); its `warps` groups take runs of
    keys."""
    a = Shape(sig)
    dv = a.dv
    wg = LANES * warps
    grid, g = ix.launch_groups(rows * splits)
    kb = sig.builder(grid, (wg,), "_part" if splits > 1 else "")
    sig.declare_inputs(kb)
    if splits > 1:
        kb.buffer("part_acc", F32, Access.WRITE, rows * splits * dv, SCRATCH)
        kb.buffer("part_ml", F32, Access.WRITE, rows * splits * 2, SCRATCH)
    else:
        sig.declare_out(kb)
    sm = kb.shared("s_max", F32, warps)
    sl = kb.shared("s_sum", F32, warps)
    sacc = kb.shared("s_acc", F32, warps * dv)
    lane = kb.let("lane", ix.mod(local_index(), LANES))
    warp = kb.let("warp", ix.div(local_index(), LANES))
    gg = kb.let("g", g)
    with kb.if_(ix.lt(gg, i32(rows * splits))):   # uniform: whole workgroups
        rowi = kb.let("row", ix.div(gg, splits))
        split = kb.let("split", ix.mod(gg, splits))
        ti = kb.let("t", ix.mod(rowi, a.t))
        h = kb.let("h", ix.mod(ix.div(rowi, a.t), a.hq))
        li = kb.let("l", ix.div(rowi, a.t * a.hq))
        at = Keys(kb, a, li, ix.div(h, a.group))
        row = Row(kb, a, lane, li, h, ti, i32(1))
        if a.fresh:
            at.stage(wg)
            kb.barrier()
        start = kb.let("start", ix.mul(split, chunk))
        end = kb.let("end", ix.minimum(ix.add(start, chunk), i32(a.s)))
        # Walk the split only up to its last live key (mask not -inf): decode KV caches are
        # sized for the longest sequence, and the keys past the current position need no
        # reads (a split with no live key runs no trip at all).
        seen = kb.var("seen", i32(0))
        with kb.for_("e", local_index(), chunk, wg) as e:
            key = ix.minimum(ix.add(start, e), i32(a.s - 1))
            live = ix.both(ix.lt(ix.add(start, e), end),
                           ix.Sel(ix.eq(row.mask_at(key), NEG_INF), i32(0), i32(1)))
            kb.assign(seen, maximum(seen, ix.Sel(live, ix.add(e, 1), i32(0))))
        reach = kb.reduce("reach", ReduceOp.Max, seen)
        with contextlib.ExitStack() as walk:
            if REACH:
                trips = ix.div(ix.add(reach, i32(warps * DECODE_KEYS - 1)),
                               i32(warps * DECODE_KEYS))
            else:
                walk.enter_context(kb.if_(reach))
                trips = math.ceil(chunk / (warps * DECODE_KEYS))
            it = walk.enter_context(kb.for_("it", 0, trips))
            # this group's DECODE_KEYS consecutive keys; clamped so spare slots read inside
            first = kb.let("first", ix.add(start, ix.mul(ix.add(ix.mul(it, warps), warp),
                                                         DECODE_KEYS)))
            raw = [ix.add(first, i) for i in range(DECODE_KEYS)]
            keys = [kb.let("kc", ix.minimum(x, i32(a.s - 1))) for x in raw]
            starts = [at.rows(key) for key in keys]
            row.run(keys, [ix.lt(x, end) for x in raw],
                    lambda i, dk: at.load(0, starts[i][0], keys[i], dk),
                    lambda i, dvj: at.load(1, starts[i][1], keys[i], dvj))
        with kb.if_(ix.eq(lane, i32(0))):
            kb.store(sm, warp, row.m)
            kb.store(sl, warp, row.lsum)
        with kb.for_("js", 0, a.vj) as j:
            dd = kb.let("dd", ix.add(lane, ix.mul(j, LANES)))
            with kb.if_(ix.lt(dd, i32(dv))):
                kb.store(sacc, ix.add(ix.mul(warp, dv), dd), row.acc[j])
        kb.barrier()
        with kb.for_("e", local_index(), dv, wg) as e:
            mx = kb.var("mx", NEG_INF)
            with kb.for_("w", 0, warps) as w:
                kb.assign(mx, maximum(mx, sm[w]))
            mb = kb.let("mb", finite_or_zero(mx))
            tot_l = kb.var("tot_l", f32(0.0))
            tot_a = kb.var("tot_a", f32(0.0))
            with kb.for_("w2", 0, warps) as w:
                f = kb.let("f", exp(sm[w] - mb))
                kb.assign(tot_l, tot_l + sl[w] * f)
                kb.assign(tot_a, tot_a + sacc[ix.add(ix.mul(w, dv), e)] * f)
            if splits == 1:
                kb.store("out", ix.add(ix.mul(rowi, dv), e),
                         a.divide(tot_a, tot_l, mb, h).cast(sig.out.dtype))
            else:
                kb.store("part_acc", ix.add(ix.mul(gg, dv), e), tot_a)
                with kb.if_(ix.eq(e, i32(0))):
                    kb.store("part_ml", ix.mul(gg, 2), mx)
                    kb.store("part_ml", ix.add(ix.mul(gg, 2), 1), tot_l)
    return kb.finish()


def _merge_kernel(sig: Sig, rows: int, splits: int):
    a = Shape(sig)
    dv = sig.out.shape[-1]
    count = rows * dv
    grid, flat = ix.launch_1d(count, 256)
    kb = sig.builder(grid, (256,), "_merge")
    kb.buffer("part_acc", F32, Access.READ, rows * splits * dv, SCRATCH)
    ml = kb.buffer("part_ml", F32, Access.READ, rows * splits * 2, SCRATCH)
    if a.sinks is not None:
        sig.declare_input(kb, 4)
    sig.declare_out(kb)
    i = kb.let("i", flat)
    with kb.if_(ix.lt(i, i32(count))):
        row = kb.let("row", ix.div(i, dv))
        e = kb.let("e", ix.mod(i, dv))
        mx = kb.var("mx", NEG_INF)
        with kb.for_("sp", 0, splits) as sp:
            kb.assign(mx, maximum(mx, ml[ix.mul(ix.add(ix.mul(row, splits), sp), 2)]))
        mb = kb.let("mb", finite_or_zero(mx))
        tot_l = kb.var("tot_l", f32(0.0))
        tot_a = kb.var("tot_a", f32(0.0))
        with kb.for_("sp2", 0, splits) as sp:
            part = kb.let("part", ix.add(ix.mul(row, splits), sp))
            f = kb.let("f", exp(ml[ix.mul(part, 2)] - mb))
            kb.assign(tot_l, tot_l + ml[ix.add(ix.mul(part, 2), 1)] * f)
            kb.assign(tot_a, tot_a + Load("part_acc", ix.add(ix.mul(part, dv), e), F32) * f)
        h = ix.mod(ix.div(row, a.t), a.hq)
        kb.store("out", i, a.divide(tot_a, tot_l, mb, h).cast(sig.out.dtype))
    return kb.finish()
