"""Attention: softmax(q k^T * scale + mask) v with GQA, online softmax, no score matrix.

One workgroup per query row (lead, head, t) and KV split. Its 32-lane groups
take runs of KEYS consecutive keys in turn; the lanes of a group split the head
dimension, so a score is one width-32 cooperative sum (KEYS of them in flight
at once), and each lane keeps its slice of the running output in registers
with the online-softmax rescaling (one rescale per run of keys). The groups merge
through shared memory. For decode (few rows) the keys are split across
workgroups too (split-KV) and a second kernel merges the partial results;
prefill rows are many, so each workgroup takes all keys of its row.
"""
from __future__ import annotations

import math

from poot.codegen import index as ix
from poot.codegen.expr import Const, Expr, Load, Un, f32, i32, maximum
from poot.codegen.lower.base import Sig, lowers
from poot.codegen.program import SCRATCH, Access, Buffer, Lowering, local_index
from poot.dtypes import DType
from poot.ir.ops import Attention, ReduceOp, UnaryOp

F32 = DType.F32
LANES = 32
WARPS = 4
KEYS = 8          # keys one 32-lane group scores per loop trip (independent chains in flight)
NEG_INF = Const(float("-inf"), F32)


def exp(x: Expr) -> Expr:
    return Un(UnaryOp.Exp, x)


def finite_or_zero(m: Expr) -> Expr:
    """The running max used as the exponent base: 0 while nothing was seen (-inf),
    so exp(-inf - base) = 0 instead of NaN."""
    return ix.Sel(ix.eq(m, NEG_INF), f32(0.0), m)


def choose_splits(rows: int, keys: int) -> int:
    """Split the keys across workgroups when there are too few rows to fill a GPU: aim at
    about 512 workgroups, with at least 64 keys each. (Measured on an H200, decode with 32
    rows and S=16384: 4 splits ran at 58 GB/s of K/V; the per-key dependency chain of a
    32-lane group is long, so more groups in flight is what helps.)"""
    if rows >= 512:
        return 1
    return max(1, min(math.ceil(keys / 64), 512 // max(rows, 1)))


@lowers(Attention)
def lower_attention(sig: Sig) -> Lowering:
    q, k = sig.type(0), sig.type(1)
    s = k.shape[-2]
    rows = math.prod(q.shape[:-1])
    splits = choose_splits(rows, s)
    chunk = math.ceil(s / splits)
    scratch = ()
    kernels = [_partial_kernel(sig, rows, splits, chunk)]
    if splits > 1:
        scratch = (_part_acc(sig, rows, splits), _part_ml(rows, splits))
        kernels.append(_merge_kernel(sig, rows, splits))
    return Lowering(tuple(kernels), scratch=scratch)


def _part_acc(sig, rows, splits):
    return Buffer("part_acc", F32, Access.READ_WRITE, rows * splits * sig.out.shape[-1], SCRATCH)


def _part_ml(rows, splits):
    return Buffer("part_ml", F32, Access.READ_WRITE, rows * splits * 2, SCRATCH)


def _partial_kernel(sig: Sig, rows: int, splits: int, chunk: int):
    q, k, v, mask = (sig.type(i) for i in range(4))
    *lead, hq, t, d = q.shape
    hkv, s, dv = k.shape[-3], k.shape[-2], v.shape[-1]
    group = hq // hkv
    dj, vj = math.ceil(d / LANES), math.ceil(dv / LANES)
    wg = LANES * WARPS
    grid, g = ix.launch_groups(rows * splits)
    kb = sig.builder(grid, (wg,), "_part" if splits > 1 else "")
    sig.declare_inputs(kb)
    if splits > 1:
        kb.buffer("part_acc", F32, Access.WRITE, rows * splits * dv, SCRATCH)
        kb.buffer("part_ml", F32, Access.WRITE, rows * splits * 2, SCRATCH)
    else:
        sig.declare_out(kb)
    qreg = kb.local("qreg", F32, dj)
    acc = kb.local("acc", F32, vj)
    sm = kb.shared("s_max", F32, WARPS)
    sl = kb.shared("s_sum", F32, WARPS)
    sacc = kb.shared("s_acc", F32, WARPS * dv)
    lane = kb.let("lane", ix.mod(local_index(), LANES))
    warp = kb.let("warp", ix.div(local_index(), LANES))
    gg = kb.let("g", g)
    with kb.if_(ix.lt(gg, i32(rows * splits))):   # uniform: whole workgroups
        row = kb.let("row", ix.div(gg, splits))
        split = kb.let("split", ix.mod(gg, splits))
        ti = kb.let("t", ix.mod(row, t))
        h = kb.let("h", ix.mod(ix.div(row, t), hq))
        li = kb.let("l", ix.div(row, t * hq))
        kvh = kb.let("kvh", ix.div(h, group))
        kbase = kb.let("kbase", ix.mul(ix.add(ix.mul(li, hkv), kvh), s * d))
        vbase = kb.let("vbase", ix.mul(ix.add(ix.mul(li, hkv), kvh), s * dv))
        qbase = ix.mul(row, d)
        with kb.for_("jq", 0, dj) as j:
            dd = ix.add(lane, ix.mul(j, LANES))
            val = Load("in0", ix.add(qbase, ix.minimum(dd, i32(d - 1))), q.dtype).cast(F32)
            kb.store(qreg, j, ix.Sel(ix.lt(dd, i32(d)), val, f32(0.0)))
        with kb.for_("ja", 0, vj) as j:
            kb.store(acc, j, f32(0.0))
        m = kb.var("m", NEG_INF)
        lsum = kb.var("lsum", f32(0.0))
        start = kb.let("start", ix.mul(split, chunk))
        end = kb.let("end", ix.minimum(ix.add(start, chunk), i32(s)))
        mrow = list(ix.unravel(li, lead)) + [kvh, ix.mod(h, group), ti]

        def mask_at(kc):
            c = ix.broadcast_coords(mrow + [kc], mask.shape)
            return Load("in3", ix.ravel(c, mask.shape), mask.dtype).cast(F32)

        with kb.for_("it", 0, math.ceil(chunk / (WARPS * KEYS))) as it:
            # this group's KEYS consecutive keys; clamped so spare slots read inside k and v
            first = kb.let("first", ix.add(start, ix.mul(ix.add(ix.mul(it, WARPS), warp), KEYS)))
            keys = [ix.add(first, i) for i in range(KEYS)]
            kcs = [kb.let("kc", ix.minimum(key, i32(s - 1))) for key in keys]
            parts = [kb.var("part", f32(0.0)) for _ in keys]
            with kb.for_("jk", 0, dj) as j:
                dk = kb.let("dk", ix.minimum(ix.add(lane, ix.mul(j, LANES)), i32(d - 1)))
                qj = kb.let("qj", qreg[j])
                for part, kc in zip(parts, kcs, strict=True):
                    kval = Load("in1", ix.add(kbase, ix.add(ix.mul(kc, d), dk)), k.dtype)
                    kb.assign(part, part + qj * kval.cast(F32))
            # KEYS independent width-32 reductions: their shuffles overlap
            scores = []
            for part, key, kc in zip(parts, keys, kcs, strict=True):
                dot = kb.reduce("dot", ReduceOp.Sum, part, LANES)
                scores.append(kb.let("score", ix.Sel(ix.lt(key, end),
                                                      dot * f32(sig.op.scale) + mask_at(kc),
                                                      NEG_INF)))
            m_new = m
            for sc in scores:
                m_new = maximum(m_new, sc)
            m_new = kb.let("m_new", m_new)
            base = kb.let("base", finite_or_zero(m_new))
            corr = kb.let("corr", exp(m - base))
            ps = [kb.let("p", exp(sc - base)) for sc in scores]
            total = lsum * corr
            for p in ps:
                total = total + p
            kb.assign(lsum, total)
            with kb.for_("jv", 0, vj) as j:
                dv_j = kb.let("dv", ix.minimum(ix.add(lane, ix.mul(j, LANES)), i32(dv - 1)))
                out_j = acc[j] * corr
                for p, kc in zip(ps, kcs, strict=True):
                    vval = Load("in2", ix.add(vbase, ix.add(ix.mul(kc, dv), dv_j)), v.dtype)
                    out_j = out_j + p * vval.cast(F32)
                kb.store(acc, j, out_j)
            kb.assign(m, m_new)
        with kb.if_(ix.eq(lane, i32(0))):
            kb.store(sm, warp, m)
            kb.store(sl, warp, lsum)
        with kb.for_("js", 0, vj) as j:
            dd = kb.let("dd", ix.add(lane, ix.mul(j, LANES)))
            with kb.if_(ix.lt(dd, i32(dv))):
                kb.store(sacc, ix.add(ix.mul(warp, dv), dd), acc[j])
        kb.barrier()
        with kb.for_("e", local_index(), dv, wg) as e:
            mx = kb.var("mx", NEG_INF)
            with kb.for_("w", 0, WARPS) as w:
                kb.assign(mx, maximum(mx, sm[w]))
            mb = kb.let("mb", finite_or_zero(mx))
            tot_l = kb.var("tot_l", f32(0.0))
            tot_a = kb.var("tot_a", f32(0.0))
            with kb.for_("w2", 0, WARPS) as w:
                f = kb.let("f", exp(sm[w] - mb))
                kb.assign(tot_l, tot_l + sl[w] * f)
                kb.assign(tot_a, tot_a + sacc[ix.add(ix.mul(w, dv), e)] * f)
            if splits == 1:
                kb.store("out", ix.add(ix.mul(row, dv), e), (tot_a / tot_l).cast(sig.out.dtype))
            else:
                kb.store("part_acc", ix.add(ix.mul(gg, dv), e), tot_a)
                with kb.if_(ix.eq(e, i32(0))):
                    kb.store("part_ml", ix.mul(gg, 2), mx)
                    kb.store("part_ml", ix.add(ix.mul(gg, 2), 1), tot_l)
    return kb.finish()


def _merge_kernel(sig: Sig, rows: int, splits: int):
    dv = sig.out.shape[-1]
    count = rows * dv
    grid, flat = ix.launch_1d(count, 256)
    kb = sig.builder(grid, (256,), "_merge")
    kb.buffer("part_acc", F32, Access.READ, rows * splits * dv, SCRATCH)
    ml = kb.buffer("part_ml", F32, Access.READ, rows * splits * 2, SCRATCH)
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
        kb.store("out", i, (tot_a / tot_l).cast(sig.out.dtype))
    return kb.finish()
