"""A catalog of lowering cases: every op the lowerings handle, over a spread of shapes
(odd sizes, size 1, non-multiples of the tiles) and dtypes, with seeded inputs.

The codegen tests run each case through the kernel interpreter against the
oracle; every backend's tests can print and compile the same kernels. A case's
`make(rng)` returns the operand arrays (None for literals); `tol` is the NMSE
bound (0: bit-exact).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from poot.dtypes import DType
from poot.ir import region
from poot.ir.graph import Lit
from poot.ir.ops import (
    ArgTopK,
    Attention,
    Binary,
    BinaryOp,
    BlockTopK,
    Broadcast,
    Cast,
    Concat,
    ContractionEpilogue,
    ContractionPrologue,
    DenseContraction,
    DenseRowGather,
    DynamicUpdateSlice,
    FreshKVAttention,
    Fused,
    FusedRow,
    GatedContraction,
    Gather,
    GroupedDenseContraction,
    IndexedMatMul,
    IndexedPackedContraction,
    Iota,
    MatMul,
    NormedDenseContraction,
    NormedPackedContraction,
    OpKind,
    PackedContraction,
    PackedDequant,
    PackedRowGather,
    PagedAttention,
    QuantizeI8,
    Reduce,
    ReduceOp,
    Reshape,
    Rope,
    RopeScatter,
    RopeUpdateSlice,
    Scan,
    ScatterUpdate,
    Select,
    SelectedAttention,
    SinkAttention,
    Slice,
    TokenMajorAttention,
    Transpose,
    TransposedUpdateSlice,
    Unary,
    UnaryOp,
)
from poot.ir.ops.composite import rms_norm_chain
from poot.ir.types import TensorType

F32, F16, BF16, I32, U32 = DType.F32, DType.F16, DType.BF16, DType.I32, DType.U32
T = TensorType


@dataclass(frozen=True)
class Case:
    id: str
    op: OpKind
    ins: tuple
    make: Callable[[np.random.Generator], list]
    tol: float = 0.0

    def types(self) -> list[TensorType]:
        return [x.type if isinstance(x, Lit) else x for x in self.ins]

    def out(self) -> TensorType:
        return self.op.infer(self.types())


# -- input makers -------------------------------------------------------------------
def normal(t: TensorType, positive: bool = False, scale: float = 1.0):
    def f(rng):
        x = rng.standard_normal(t.shape) * scale
        return (np.abs(x) + 0.1 if positive else x).astype(t.dtype.numpy)
    return f


def ints(t: TensorType, lo: int, hi: int):
    return lambda rng: rng.integers(lo, hi, t.shape).astype(t.dtype.numpy)


def specials(t: TensorType):
    """Normal values with NaN, +-Inf and -0 sprinkled in (Select moves them bit for bit)."""
    def f(rng):
        x = rng.standard_normal(t.shape).astype(np.float32)
        flat = x.reshape(-1)
        flat[:: 7] = np.nan
        flat[3:: 11] = np.inf
        flat[5:: 13] = -np.inf
        flat[1:: 17] = -0.0
        return x.astype(t.dtype.numpy)
    return f


def makers(*fs):
    return lambda rng: [f(rng) if f is not None else None for f in fs]


def lit_maker(n: int):
    return lambda rng: [None] * n


# -- the catalog ----------------------------------------------------------------------
FLOAT_UNARY = [u for u in UnaryOp if not u.bitwise]
FLOAT_BINARY = [b for b in BinaryOp if not b.bitwise]
INT_BINARY = list(BinaryOp)
#: what u32 and 8/16-bit integers are checked with (every arithmetic sub-op)
ARITH_BINARY = [b for b in BinaryOp if not b.bitwise and b is not BinaryOp.Sub]


def _tol(dtype: DType) -> float:
    return {F32: 1e-10, F16: 1e-5, BF16: 1e-4}.get(dtype, 0.0)


def elementwise_cases() -> list[Case]:
    out = []
    for dt in (F32, BF16, F16):
        t = T((3, 37), dt)
        for op in FLOAT_UNARY:
            pos = op in (UnaryOp.Log, UnaryOp.Sqrt)
            out.append(Case(f"unary-{op.value}-{dt}", Unary(op), (t,), makers(normal(t, pos)),
                            _tol(dt)))
        a, b = T((3, 1, 5), dt), T((4, 5), dt)
        for op in FLOAT_BINARY:
            out.append(Case(f"binary-{op.value}-{dt}", Binary(op), (a, b),
                            makers(normal(a), normal(b)), _tol(dt)))
    for dt in (I32, U32):
        t = T((5, 13), dt)
        out.append(Case(f"unary-not-{dt}", Unary(UnaryOp.Not), (t,), makers(ints(t, 0, 2**31))))
        out.append(Case(f"unary-clz-{dt}", Unary(UnaryOp.Clz), (t,),
                        lambda rng, t=t: [(rng.integers(0, 2**32, t.shape, dtype=np.uint64)
                                           >> rng.integers(0, 33, t.shape).astype(np.uint64))
                                          .astype(np.uint32).view(t.dtype.numpy)]))
    t = T((2, 50), I32)
    out.append(Case("unary-neg-i32", Unary(UnaryOp.Neg), (t,), makers(ints(t, -2**31, 2**31))))
    a, b = T((4, 1, 9), I32), T((3, 9), I32)
    for op in INT_BINARY:
        lo, hi = (-3, 40) if op in (BinaryOp.Shl, BinaryOp.Shr) else (-5, 6)
        out.append(Case(f"binary-{op.value}-i32", Binary(op), (a, b),
                        makers(ints(a, -2**31, 2**31), ints(b, lo, hi))))
    a = T((7, 11), U32)
    for op in (*ARITH_BINARY, BinaryOp.Shr, BinaryOp.Shl, BinaryOp.GeU):
        out.append(Case(f"binary-{op.value}-u32", Binary(op), (a, a),
                        makers(ints(a, 0, 2**32), ints(a, 0, 40))))
    for dt in (DType.I8, DType.U16):
        a, b = T((3, 1, 7), dt), T((5, 7), dt)
        info = np.iinfo(dt.numpy)
        for op in ARITH_BINARY:
            out.append(Case(f"binary-{op.value}-{dt}", Binary(op), (a, b),
                            makers(ints(a, info.min, info.max), ints(b, -3 if info.min else 0,
                                                                     4))))
    t = T((6, 10), F32)
    out.append(Case("binary-mul-literal", Binary(BinaryOp.Mul), (t, Lit(0.125, F32)),
                    makers(normal(t), None), 1e-12))
    for dt in (F32, BF16, F16, I32, DType.U8):
        c, x = T((3, 1, 8), I32), T((2, 8), dt)
        mk = specials(x) if dt.is_float else ints(x, -100, 100)
        out.append(Case(f"select-{dt}", Select(), (c, x, x), makers(ints(c, 0, 2), mk, mk)))
    for src, dst in [(F32, BF16), (F32, F16), (BF16, F32), (F16, F32), (BF16, F16), (F32, I32),
                     (I32, F32), (I32, DType.I8), (U32, F32), (F32, U32), (F32, DType.U8)]:
        t = T((9, 7), src)
        mk = (lambda rng, t=t: [(rng.standard_normal(t.shape) * 1e3).astype(t.dtype.numpy)]) \
            if src.is_float else makers(ints(t, -2**31 if src is I32 else 0, 2**31))
        out.append(Case(f"cast-{src}-{dst}", Cast(dst), (t,), mk))
    out.append(Case("cast-f32-i32-specials", Cast(I32), (T((5, 9), F32),),
                    lambda rng: [np.concatenate([specials(T((5, 8), F32))(rng) * 3e9,
                                                 np.full((5, 1), 7.9, np.float32)], 1)]))
    out.append(Case("iota-i32", Iota((3, 5, 2), 1, I32), (), lit_maker(0)))
    out.append(Case("iota-f32", Iota((70,), 0, F32), (), lit_maker(0)))
    return out


def shape_cases() -> list[Case]:
    x = T((3, 1, 5), F32)
    y = T((2, 3, 4), BF16)
    m2 = T((33, 17), F32)
    return [
        Case("broadcast", Broadcast((2, 3, 4, 5)), (x,), makers(normal(x))),
        Case("transpose", Transpose((2, 0, 1)), (y,), makers(normal(y))),
        Case("transpose-2d", Transpose((1, 0)), (m2,), makers(normal(m2))),
        Case("slice", Slice(2, 1, 4), (y,), makers(normal(y))),
        Case("slice-neg-axis", Slice(-2, 2, 3), (y,), makers(normal(y))),
        Case("concat", Concat(1), (y, T((2, 1, 4), BF16), y),
             makers(normal(y), normal(T((2, 1, 4), BF16)), normal(y))),
        Case("reshape-alias", Reshape((4, 6)), (y,), makers(normal(y))),
    ]


def data_cases() -> list[Case]:
    src, idx = T((11, 6), BF16), T((2, 3), I32)
    src3 = T((3, 8, 2), F32)
    base, rows, slots = T((9, 2, 3), F32), T((5, 2, 3), F32), T((5,), I32)
    return [
        Case("gather-axis0", Gather(0), (src, idx), makers(normal(src), ints(idx, 0, 11))),
        Case("gather-axis1", Gather(1), (src3, idx), makers(normal(src3), ints(idx, 0, 8))),
        Case("scatter-update", ScatterUpdate(), (base, rows, slots),
             lambda rng: [normal(base)(rng), normal(rows)(rng),
                          np.array([3, -1, 8, 3, 0], np.int32)]),
        Case("dynamic-update-slice", DynamicUpdateSlice(1), (src3, T((3, 3, 2), F32),
                                                             T((1,), I32)),
             lambda rng: [normal(src3)(rng), normal(T((3, 3, 2), F32))(rng),
                          np.array([6], np.int32)]),
        Case("dynamic-update-slice-scalar", DynamicUpdateSlice(0), (T((7, 4), BF16),
                                                                    T((1, 4), BF16), T((), I32)),
             lambda rng: [normal(T((7, 4), BF16))(rng), normal(T((1, 4), BF16))(rng),
                          np.array(2, np.int32)]),
        Case("argtopk-ties", ArgTopK(3), (T((4, 10), F32),),
             lambda rng: [rng.integers(0, 4, (4, 10)).astype(np.float32)]),
        Case("argtopk-k1", ArgTopK(1), (T((2, 3, 64), F32),), makers(normal(T((2, 3, 64), F32)))),
        Case("argtopk-specials", ArgTopK(6), (T((3, 700), F32),), _special_rows),
        Case("argtopk-i32-extremes", ArgTopK(5), (T((2, 300), I32),),
             lambda rng: [np.where(rng.random((2, 300)) < 0.5, -2 ** 31,
                                   rng.integers(-3, 3, (2, 300))).astype(np.int32)]),
        Case("argtopk-u32", ArgTopK(4), (T((2, 90), U32),),
             lambda rng: [rng.integers(0, 2 ** 32, (2, 90), dtype=np.uint64).astype(np.uint32)]),
        Case("argtopk-counting", ArgTopK(70), (T((2, 80), F32),),
             makers(normal(T((2, 80), F32)))),
    ]


def _special_rows(rng) -> list:
    """Rows with NaN, infinities, signed zeros and ties, where key order must match the
    oracle's float64 order (NaN last, -0 equal to +0)."""
    x = rng.integers(-2, 3, (3, 700)).astype(np.float32)
    x[0, ::7] = np.nan
    x[1, ::5] = -0.0
    x[1, 3] = np.inf
    x[2] = -np.inf
    x[2, 600:] = np.nan
    return [x]


def reduce_cases() -> list[Case]:
    out = []
    for op in (ReduceOp.Sum, ReduceOp.Max):
        for shape, axis, keep in [((3, 300), -1, True), ((4, 7, 5), 1, False), ((1, 1), 0, True),
                                  ((2, 1000), 1, False)]:
            t = T(shape, F32)
            out.append(Case(f"reduce-{op.value}-{shape}-{axis}", Reduce(op, axis, keep), (t,),
                            makers(normal(t)), 1e-10))
        for dt in (BF16, I32, DType.I16, DType.U8):
            t = T((5, 33), dt)
            mk = normal(t) if dt.is_float else ints(t, -1000, 1000)
            out.append(Case(f"reduce-{op.value}-{dt}", Reduce(op, -1, False), (t,), makers(mk),
                            _tol(dt)))
    return out


def _matmul(sa, sb, dt=F32, tol=1e-10):
    a, b = T(sa, dt), T(sb, dt)
    mk = (lambda t: ints(t, -9, 9)) if dt is I32 else normal
    return Case(f"matmul-{sa}-{sb}-{dt}", MatMul(), (a, b), makers(mk(a), mk(b)),
                tol if dt is F32 else (_tol(dt) if dt.is_float else 0.0))


def matmul_cases() -> list[Case]:
    x, w, idx = T((5, 12), F32), T((3, 12, 7), F32), T((5,), I32)
    return [
        _matmul((1, 37), (37, 19)), _matmul((2, 1, 40), (40, 5)),
        _matmul((3, 20, 33), (3, 33, 17)), _matmul((18, 7), (7, 40)),
        _matmul((2, 1, 6, 9), (3, 9, 5)), _matmul((20, 33), (33, 17), BF16),
        _matmul((5, 8), (8, 3), I32), _matmul((1, 64), (64, 64), F16),
        _matmul((70, 33), (33, 90)), _matmul((2, 64, 16), (2, 16, 64), BF16),
        Case("indexed-matmul", IndexedMatMul(), (x, w, idx),
             makers(normal(x), normal(w), ints(idx, 0, 3)), 1e-10),
    ]


# -- regions --------------------------------------------------------------------------
def _rmsnorm(b, x, w):
    return rms_norm_chain(b, x, w, 1e-5)


def _softmax(b, s):
    m = b.eqn(Reduce(ReduceOp.Max, -1, True), s)
    ex = b.eqn(Unary(UnaryOp.Exp), b.eqn(Binary(BinaryOp.Sub), s, m))
    den = b.eqn(Reduce(ReduceOp.Sum, -1, True), ex)
    return b.eqn(Binary(BinaryOp.Div), ex, den)


def silu_mul(b, g, u):
    neg = b.eqn(Unary(UnaryOp.Neg), g)
    sig = b.eqn(Unary(UnaryOp.Recip), b.eqn(Binary(BinaryOp.Add),
                                           b.eqn(Unary(UnaryOp.Exp), neg), b.lit(1.0, F32)))
    return b.eqn(Binary(BinaryOp.Mul), b.eqn(Binary(BinaryOp.Mul), g, sig), u)


def _fused_mixed(b, x, y):
    t = b.eqn(Transpose((1, 0)), y)                              # [5, 3]
    r = b.eqn(Reshape((3, 5)), t)
    s = b.eqn(Slice(1, 1, 4), x)                                 # [3, 3] of x [3, 6]
    c = b.eqn(Concat(1), s, b.eqn(Slice(1, 0, 2), r))            # [3, 5]
    io = b.eqn(Cast(F32), b.eqn(Iota((3, 5), 1, I32)))
    sel = b.eqn(Select(), b.eqn(Binary(BinaryOp.Ge), c, io), c, b.eqn(Unary(UnaryOp.Tanh), r))
    return b.eqn(Binary(BinaryOp.Add), sel, b.eqn(Broadcast((3, 5)), b.eqn(Slice(1, 0, 1), x)))


def region_cases() -> list[Case]:
    x, w = T((4, 300), F32), T((300,), F32)
    s = T((2, 3, 50), F32)
    g = T((3, 70), F32)
    fx, fy = T((3, 6), F32), T((5, 3), F32)
    xb = T((3, 64), BF16)
    return [
        Case("fused-silu-mul", Fused(region([g, g], silu_mul)), (g, g),
             makers(normal(g), normal(g)), 1e-10),
        Case("fused-mixed", Fused(region([fx, fy], _fused_mixed)), (fx, fy),
             makers(normal(fx), normal(fy)), 1e-10),
        Case("fused-row-rmsnorm", FusedRow(region([x, w], _rmsnorm), -1), (x, w),
             makers(normal(x), normal(w)), 1e-10),
        Case("fused-row-softmax", FusedRow(region([s], _softmax), -1), (s,), makers(normal(s)),
             1e-10),
        Case("fused-row-softmax-of-bf16", FusedRow(region(
            [xb], lambda b, v: _softmax(b, b.eqn(Cast(F32), v))), -1), (xb,),
             makers(normal(xb)), 1e-10),
        Case("fused-row-sum-root", FusedRow(region([s], lambda b, v: b.eqn(
            Reduce(ReduceOp.Sum, -1, False), b.eqn(Binary(BinaryOp.Mul), v, v))), -1), (s,),
             makers(normal(s)), 1e-10),
    ]


def rope_cases() -> list[Case]:
    out = []
    for dt, rot in ((F32, 8), (BF16, 10), (F16, 64)):
        x = T((2, 3, 10 if rot <= 10 else 64), dt)
        cs = T((3, rot // 2), dt)
        out.append(Case(f"rope-{dt}-{rot}", Rope(rot), (x, cs, cs),
                        makers(normal(x), normal(cs), normal(cs)), _tol(dt)))
    pool, x, cs = T((9, 3, 10), F32), T((2, 2, 3, 10), F32), T((2, 1, 4), F32)
    out.append(Case("rope-scatter", RopeScatter(8), (pool, x, cs, cs, T((4,), I32)),
                    lambda rng: [normal(pool)(rng), normal(x)(rng), normal(cs)(rng),
                                 normal(cs)(rng), np.array([7, -1, 2, 7], np.int32)],
                    _tol(F32)))
    cache, k, ck = T((3, 9, 10), F32), T((1, 1, 3, 10), F32), T((1, 1, 1, 4), F32)
    for c in (cache, T(cache.shape, F16)):    # an f16 cache rounds the f32 rotated keys
        out.append(Case(f"rope-update-slice-{c.dtype}-cache", RopeUpdateSlice(8, 1),
                        (c, k, ck, ck, T((1,), I32)),
                        lambda rng, c=c: [normal(c)(rng), normal(k)(rng), normal(ck)(rng),
                                          normal(ck)(rng), np.array([6], np.int32)],
                        _tol(c.dtype)))
    # three tokens' keys [T, Hkv, D] written head by head into the cache [Hkv, S, D]
    k3, ck3 = T((1, 3, 3, 10), F32), T((1, 3, 1, 4), F32)
    out.append(Case("rope-update-slice-tokens-first", RopeUpdateSlice(8, 1, True),
                    (cache, k3, ck3, ck3, T((1,), I32)),
                    lambda rng: [normal(cache)(rng), normal(k3)(rng), normal(ck3)(rng),
                                 normal(ck3)(rng), np.array([5], np.int32)], _tol(F32)))
    v3 = T((3, 3, 10), F32)      # and their values, not rotated, into an f16 cache
    c16 = T(cache.shape, F16)
    out.append(Case("transposed-update-slice-f16-cache", TransposedUpdateSlice(1),
                    (c16, v3, T((1,), I32)),
                    lambda rng: [normal(c16)(rng), normal(v3)(rng), np.array([5], np.int32)],
                    _tol(F16)))
    return out


def attention_mask(m: TensorType, live: int | None = None):
    """An additive mask: 0 or -inf at random, the first key always kept, keys from `live`
    on masked out."""
    def f(rng):
        keep = rng.random(m.shape) < 0.8
        keep[..., 0] = True
        if live is not None:
            keep[..., live:] = False
        return np.where(keep, 0.0, -np.inf).astype(m.dtype.numpy)
    return f


def _attention(hq, hkv, t, s, d, dv, lead=(), mshape=None, dt=F32, live=None,
               tokens_first=False):
    """`live`: keys past it are masked out, as in a KV cache sized past the position;
    `tokens_first`: TokenMajorAttention, q [..., T, Hq, D]."""
    rows = (t, hq) if tokens_first else (hq, t)
    q, k, v = T(lead + rows + (d,), dt), T(lead + (hkv, s, d), dt), T(lead + (hkv, s, dv), dt)
    m = T(mshape or (t, s), dt)
    mask = attention_mask(m, live)
    name = f"attention-{hq}x{hkv}-t{t}-s{s}-d{d}-{dt}" + (f"-live{live}" if live else "") + \
        ("-tokens-first" if tokens_first else "")
    op = TokenMajorAttention if tokens_first else Attention
    return Case(name, op(float(d) ** -0.5),
                (q, k, v, m), makers(normal(q), normal(k), normal(v), mask),
                1e-10 if dt is F32 else 1e-3)


def _paged(b, hq, hkv, t, s, d, pool, live=None, dt=F32):
    """PagedAttention: each of b sequences reads its s positions through a slot map into a
    pool of `pool` rows (slots repeat, as padding rows point at slot 0); `live`: positions
    past it are masked out, as in a serving batch."""
    q, k, v = T((b, hq, t, d), dt), T((pool, hkv, d), dt), T((pool, hkv, d), dt)
    smap, m = T((b, s), I32), T((b, 1, 1, t, s), dt)
    mask = attention_mask(m, live)
    name = f"paged-attention-b{b}-{hq}x{hkv}-t{t}-s{s}-d{d}-p{pool}-{dt}"
    return Case(name, PagedAttention(float(d) ** -0.5), (q, k, v, smap, m),
                makers(normal(q), normal(k), normal(v), ints(smap, 0, pool), mask),
                1e-10 if dt is F32 else 1e-3)


def _sinks(hq, hkv, t, s, d, dt=F32, live=None):
    """SinkAttention: a sink logit per query head joins each row's softmax."""
    q, k, v = T((hq, t, d), dt), T((hkv, s, d), dt), T((hkv, s, d), dt)
    m, sinks = T((t, s), dt), T((hq,), dt)
    name = f"sink-attention-{hq}x{hkv}-t{t}-s{s}-d{d}-{dt}" + (f"-live{live}" if live else "")
    return Case(name, SinkAttention(float(d) ** -0.5), (q, k, v, m, sinks),
                makers(normal(q), normal(k), normal(v), attention_mask(m, live), normal(sinks)),
                1e-10 if dt is F32 else 1e-3)


def _fresh(hq, hkv, t, s, d, at, rot=None, live=None, cache=F32):
    """FreshKVAttention: this step's t rows (f32; rotated by `rot` features) written in at
    `at` (clamped), read where they are; `cache`: the caches' dtype."""
    q, kc, new = T((hq, t, d), F32), T((hkv, s, d), cache), T((hkv, t, d), F32)
    tab, m = T((t, (rot or d) // 2), F32), T((t, s), F32)
    name = f"fresh-kv-attention-{hq}x{hkv}-t{t}-s{s}-d{d}-at{at}-{cache}" + \
        (f"-live{live}" if live else "")
    return Case(name, FreshKVAttention(float(d) ** -0.5, rot or d),
                (q, kc, kc, m, new, new, tab, tab, T((1,), I32)),
                makers(normal(q), normal(kc), normal(kc), attention_mask(m, live), normal(new),
                       normal(new), normal(tab), normal(tab),
                       lambda rng: np.array([at], np.int32)),
                1e-10 if cache is F32 else 1e-3)


def attention_cases() -> list[Case]:
    return [
        _fresh(4, 2, 1, 300, 64, 169, live=170),    # decode, split-KV: the row in one split
        _fresh(3, 1, 1, 20, 32, 7, rot=16, cache=F16),   # partial rotation, f16 cache
        _fresh(4, 2, 3, 40, 16, 39),                 # prefill tiles, index clamped to 37
        _sinks(4, 2, 1, 300, 64, live=170),                 # decode, split-KV, merged sinks
        _sinks(4, 2, 5, 40, 16),                             # prefill tiles
        _sinks(2, 1, 1, 20, 32, dt=BF16),
        _paged(3, 4, 2, 1, 300, 64, 97, live=70),         # decode, split-KV, dead splits
        _paged(2, 3, 1, 4, 40, 16, 50),                     # prefill tiles
        _paged(2, 3, 1, 4, 120, 16, 50, live=37),           # prefill walks to the last live key
        _paged(2, 2, 2, 1, 9, 32, 12, dt=BF16),
        _attention(4, 2, 1, 300, 64, 64),                   # decode, GQA, split-KV
        _attention(3, 3, 5, 40, 16, 24, lead=(2,)),          # prefill, lead axis
        _attention(4, 1, 1, 37, 80, 80, mshape=(1, 37)),     # MQA, head dim past 64
        _attention(2, 1, 3, 20, 8, 8, dt=BF16),
        _attention(2, 2, 1, 1, 32, 32, dt=F16),              # one key
        _attention(2, 1, 1, 1000, 32, 40),                   # 16 KV splits, ragged runs
        _attention(3, 1, 1, 1000, 64, 64, live=130),         # splits past the position
        _attention(6, 2, 3, 45, 72, 40),                     # prefill GQA, ragged block/tile
        _attention(3, 1, 4, 200, 16, 16, live=50),           # prefill, keys past 50 unread
        _attention(2, 2, 2, 9, 256, 256, dt=BF16),           # prefill, wide heads: small tiles
        _attention(6, 2, 3, 45, 72, 40, tokens_first=True),  # rows token by token
        _attention(4, 2, 1, 300, 64, 64, tokens_first=True),  # decode: either order
    ]


def _selected(h, t, s, d, dv, block, listed, dt=F32, mshape=None):
    """Listed block ids include repeats and ids naming no block (-1, S/block)."""
    q, k, v = T((h, t, d), dt), T((h, s, d), dt), T((h, s, dv), dt)
    blocks, m = T((h, t, listed), I32), T(mshape or (t, s), dt)

    def mask(rng):
        keep = rng.random(m.shape) < 0.8
        return np.where(keep, 0.0, -np.inf).astype(dt.numpy)
    return Case(f"selected-attention-h{h}-t{t}-s{s}-b{block}-kb{listed}-{dt}",
                SelectedAttention(block, float(d) ** -0.5), (q, k, v, blocks, m),
                makers(normal(q), normal(k), normal(v), ints(blocks, -1, s // block + 1), mask),
                1e-10 if dt is F32 else 1e-3)


def _scan_affine(b, c, x, y):
    return b.eqn(Binary(BinaryOp.Add), b.eqn(Binary(BinaryOp.Mul), c, x), y)


def scan_rotate(b, c, x):
    """A body that moves carry elements: rotate left by one, then add x."""
    n = c.shape[0]
    turned = b.eqn(Concat(0), b.eqn(Slice(0, 1, n), c), b.eqn(Slice(0, 0, 1), c))
    return b.eqn(Binary(BinaryOp.Add), turned, x)


def sparse_cases() -> list[Case]:
    """Block selection, attention over selected blocks, and Scan recurrences."""
    qi, ki = T((2, 5, 16), F32), T((2, 24, 16), F32)
    qb, kb = T((3, 2, 40), BF16), T((3, 64, 40), BF16)
    c, xs, ys = T((3, 5), F32), T((6, 3, 5), F32), T((6, 5), F32)
    r, rx = T((7,), I32), T((4, 7), I32)
    return [
        Case("block-topk-ties", BlockTopK(4, 3), (qi, ki),         # integers: many ties
             makers(ints(qi, -2, 3), ints(ki, -2, 3))),
        Case("block-topk-nan-inf", BlockTopK(4, 6), (qi, ki),      # NaN blocks rank last
             makers(normal(qi), specials(ki))),
        Case("block-topk-bf16", BlockTopK(8, 2), (qb, kb), makers(normal(qb), normal(kb))),
        _selected(3, 4, 24, 16, 16, 4, 3),
        _selected(2, 1, 64, 40, 24, 8, 4, dt=BF16, mshape=(2, 1, 64)),    # decode, ragged D
        Case("scan-affine-broadcast", Scan(region([c, c, T((5,), F32)], _scan_affine), 6),
             (c, xs, ys), makers(normal(c), normal(xs, scale=0.5), normal(ys)), 1e-10),
        Case("scan-rotate-i32", Scan(region([r, T((7,), I32)], scan_rotate), 4), (r, rx),
             makers(ints(r, -9, 9), ints(rx, -9, 9))),
    ]


def _dense_weight(n: int, k: int, wdt: DType):
    """A dense [N, K] weight's type and maker: U32 holds f16 values two to a word."""
    if wdt is U32:
        return T((n, k // 2), U32), lambda rng: rng.standard_normal((n, k)).astype(
            np.float16).view(np.uint32)
    w = T((n, k), wdt)
    return w, normal(w)


def _dense(m_shape, n, k, wdt, tol=1e-10):
    a = T(m_shape + (k,), F32)
    w, wmk = _dense_weight(n, k, wdt)
    return Case(f"dense-{m_shape}-{n}x{k}-{wdt}", DenseContraction(), (a, w),
                makers(normal(a), wmk), tol)


def _normed_dense(m_shape, n, k, wdt):
    """rms_norm(x, g) into a dense weight: K even and 16-bit takes the norm inside the
    GEMV, the rest run it apart first."""
    a, g = T(m_shape + (k,), F32), T((k,), F32)
    w, wmk = _dense_weight(n, k, wdt)
    return Case(f"normed-dense-{m_shape}-{n}x{k}-{wdt}", NormedDenseContraction(1e-5),
                (a, w, g), makers(normal(a), wmk, normal(g)), 1e-10)


def contraction_cases() -> list[Case]:
    ga, gw = T((3, 2, 40), F32), T((21, 40), BF16)
    tab, ids = T((11, 7), BF16), T((2, 3), I32)
    bias, res = T((20,), F32), T((3, 20), F32)
    head_a, head_w = T((3, 64), F32), T((20, 64), BF16)
    epi = region([T((3, 20), F32), bias, res], lambda b, h, bb, r: b.eqn(
        Binary(BinaryOp.Add), b.eqn(Binary(BinaryOp.Add), h, bb), r))
    return [
        _dense((1,), 20, 64, BF16), _dense((2, 9), 20, 63, BF16), _dense((2, 9), 20, 63, F16),
        _dense((1,), 12, 2088, BF16),                    # long rows: 8 words in flight
        _dense((3,), 17, 63, F32), _dense((3,), 20, 64, U32), _dense((1,), 33, 130, F16),
        _dense((2, 40), 70, 47, BF16),
        Case("grouped-dense", GroupedDenseContraction(3), (ga, gw),
             makers(normal(ga), normal(gw)), 1e-10),
        Case("dense-row-gather", DenseRowGather(), (tab, ids),
             makers(normal(tab), ints(ids, 0, 11))),
        Case("epilogue-dense-bias-residual", ContractionEpilogue(DenseContraction(), 2, epi),
             (head_a, head_w, bias, res),
             makers(normal(head_a), normal(head_w), normal(bias), normal(res)), 1e-10),
        Case("prologue-dense-silu-mul", ContractionPrologue(
            DenseContraction(), 2, region([head_a, head_a], silu_mul)),
             (head_a, head_w, head_a), makers(normal(head_a), normal(head_w), normal(head_a)),
             1e-10),
        _normed_dense((1,), 20, 64, BF16), _normed_dense((2,), 12, 2088, BF16),
        _normed_dense((1,), 19, 63, BF16), _normed_dense((3,), 17, 64, F32),
        _normed_dense((1,), 20, 64, U32), _normed_dense((6,), 20, 64, BF16),
        _gated_dense(1), _gated_dense(6),
    ]


def _gated_dense(m: int) -> Case:
    """silu(a) * b of a bf16 [40 x 64] contraction's halves: joined in the GEMV's
    workgroup for one row, after the contraction for six."""
    a, w = T((m, 64), F32), T((40, 64), BF16)
    half = T((m, 20), F32)
    return Case(f"gated-dense-m{m}", GatedContraction(
        DenseContraction(), 2, region([half, half], silu_mul)), (a, w),
        makers(normal(a), normal(w)), 1e-10)


# -- packed weights: every registered format that quantizes without parameters ----------
#: the integer GEMV's rounding (int16 activations per block of 32, lower.int_gemv) is within the
#: conformance suite's threshold for contractions, (1024 * 2^-24)^2, not within 1e-10
INT_GEMV_TOL = (1024 * 2.0 ** -24) ** 2
#: a GatedContraction's two halves meet in one product: their errors add (the conformance
#: suite's "gated" growth)
GATED_TOL = 4 * INT_GEMV_TOL


def packed_cases(formats: dict | None = None) -> list[Case]:
    from poot.formats import PackedWeight
    from poot.formats import formats as registered

    out = []
    n, k = 12, 256
    ids = T((3,), I32)
    for name, fmt in sorted((formats if formats is not None else registered()).items()):
        if not callable(getattr(fmt, "quantize", None)):
            continue
        pw = PackedWeight(name, (n, k))
        try:
            specs = pw.sources()
            fmt.quantize(np.ones((n, k), np.float32))
        except Exception:  # noqa: BLE001 - formats that need parameters are left out
            continue
        src_types = tuple(s.type for s in specs)

        def sources(rng, fmt=fmt, n=n, k=k):
            w = rng.standard_normal((n, k)).astype(np.float32)
            return [np.asarray(s) for s in fmt.quantize(w)]

        for m_shape in ((1,), (6,)):
            a = T(m_shape + (k,), F32)
            out.append(Case(f"packed-{name}-m{m_shape[0]}", PackedContraction(pw),
                            (a, *src_types), lambda rng, a=a, s=sources: [normal(a)(rng),
                                                                          *s(rng)],
                            INT_GEMV_TOL))
        a, g = T((2, k), F32), T((k,), F32)
        out.append(Case(f"packed-normed-{name}", NormedPackedContraction(pw, 1e-5),
                        (a, g, *src_types), lambda rng, a=a, g=g, s=sources: [
                            normal(a)(rng), normal(g)(rng), *s(rng)], INT_GEMV_TOL))
        a = T((1, k), F32)
        out.append(Case(f"packed-prologue-{name}", ContractionPrologue(
            PackedContraction(pw), 1 + len(src_types), region([a, a], silu_mul)),
                        (a, *src_types, a), lambda rng, a=a, s=sources: [
                            normal(a)(rng), *s(rng), normal(a)(rng)], INT_GEMV_TOL))
        half = T((1, n // 2), F32)
        out.append(Case(f"packed-gated-{name}", GatedContraction(
            PackedContraction(pw), 1 + len(src_types), region([half, half], silu_mul)),
                        (a, *src_types), lambda rng, a=a, s=sources: [normal(a)(rng), *s(rng)],
                        GATED_TOL))
        out.append(Case(f"packed-dequant-{name}", PackedDequant(pw), src_types,
                        lambda rng, s=sources: s(rng), 1e-12))
        out.append(Case(f"packed-rows-{name}", PackedRowGather(pw), (ids, *src_types),
                        lambda rng, s=sources: [ints(ids, 0, n)(rng), *s(rng)], 1e-12))
        pw3 = PackedWeight(name, (3 * n, k))
        try:
            src3 = tuple(s.type for s in pw3.sources())
        except Exception:  # noqa: BLE001
            continue
        x, idx = T((4, k), F32), T((4,), I32)
        out.append(Case(f"packed-indexed-{name}", IndexedPackedContraction(pw3, 3),
                        (x, idx, *src3),
                        lambda rng, f=fmt, x=x, idx=idx: [
                            normal(x)(rng), ints(idx, 0, 3)(rng),
                            *[np.asarray(s) for s in f.quantize(
                                rng.standard_normal((3 * n, k)).astype(np.float32))]], 1e-10))
    return out


def quantize_cases() -> list[Case]:
    """QuantizeI8: codes of normal values and of specials (NaN to 0, +-Inf clamped), for
    scales per block of 32 and one scale per row (some zero: codes 0), bit for bit."""
    def scales(t: TensorType):
        def f(rng):
            d = (np.abs(rng.standard_normal(t.shape)) * 0.05).astype(np.float32)
            d.reshape(-1)[::3] = 0.0
            return d
        return f

    out = []
    for xs, ds in (((3, 5, 32), (3, 5, 1)), ((2, 67), (2, 1))):
        x, d = T(xs, F32), T(ds, F32)
        for name, make in (("normal", normal(x, scale=3.0)), ("specials", specials(x))):
            out.append(Case(f"QuantizeI8-{name}-{'x'.join(map(str, xs))}", QuantizeI8(),
                            (x, d), makers(make, scales(d))))
    return out


def all_cases(formats: dict | None = None) -> list[Case]:
    return (elementwise_cases() + shape_cases() + data_cases() + reduce_cases()
            + matmul_cases() + region_cases() + rope_cases() + attention_cases()
            + sparse_cases() + contraction_cases() + packed_cases(formats)
            + quantize_cases())


def mismatch(got: np.ndarray, want: np.ndarray, tol: float) -> str | None:
    """Why `got` fails against `want`, or None. tol 0: bit-exact (NaN payloads too);
    otherwise NaN and Inf must match in place (and sign), and the NMSE of the finite
    elements, sum((a-b)^2)/sum(a^2), must be at most tol."""
    if got.shape != want.shape or got.dtype != want.dtype:
        return f"got {got.dtype}{list(got.shape)}, want {want.dtype}{list(want.shape)}"
    if tol == 0 or not want.dtype.kind == "f" and want.dtype.name not in (
            "bfloat16", "float16"):
        g, w = np.ascontiguousarray(got), np.ascontiguousarray(want)
        bad = g.view(np.uint8).reshape(g.size, -1) != w.view(np.uint8).reshape(w.size, -1)
        bad = bad.any(axis=1) if g.size else bad
        if not bad.any():
            return None
        i = int(np.argmax(bad))
        return f"{int(bad.sum())} of {g.size} elements differ; first at {i}: " \
               f"{g.reshape(-1)[i]!r} vs {w.reshape(-1)[i]!r}"
    g, w = got.astype(np.float64), want.astype(np.float64)
    if not np.array_equal(np.isnan(g), np.isnan(w)):
        return f"NaN positions differ ({int(np.isnan(g).sum())} vs {int(np.isnan(w).sum())})"
    inf = np.isinf(w) | np.isinf(g)
    if not np.array_equal(g[inf], w[inf]):
        return "Inf positions or signs differ"
    fin = np.isfinite(w) & np.isfinite(g)
    denom = float(np.sum(w[fin] ** 2)) or 1.0
    nmse = float(np.sum((g[fin] - w[fin]) ** 2)) / denom
    return None if nmse <= tol else f"NMSE {nmse:.3g} > {tol:.3g}"


# -- a whole graph, eqn by eqn ---------------------------------------------------------------
@dataclass(frozen=True)
class EqnCase:
    """One eqn of a real graph with the oracle's operand values and result."""

    id: str
    op: OpKind
    ins: tuple
    arrays: list
    want: np.ndarray
    tol: float

    def out(self) -> TensorType:
        return TensorType(self.want.shape, DType.of(self.want))


def eqn_cases(graph, inputs, tol_f32: float = 1e-8, tol_16: float = 1e-4) -> list[EqnCase]:
    """Every eqn of `graph` as a case: operands are the oracle's values on `inputs`, so
    each kernel is checked on the data it meets in the real model, errors not carried."""
    from poot.oracle.evaluate import apply, bind_inputs

    env = bind_inputs(graph, inputs)
    out = []
    with np.errstate(all="ignore"):
        for n, e in enumerate(graph.eqns()):
            args = [None if isinstance(x, Lit) else env[x.id] for x in e.inputs]
            ins = tuple(x if isinstance(x, Lit) else graph.type_of(x.id) for x in e.inputs)
            t = graph.type_of(e.out)
            want = np.asarray(apply(e.op, [np.asarray(x.value, x.dtype.numpy) if a is None
                                           else a for a, x in zip(args, e.inputs, strict=True)],
                                    [x.type if isinstance(x, Lit) else x for x in ins], t))
            env[e.out] = want
            tol = 0.0 if not t.dtype.is_float else (tol_f32 if t.dtype is F32 else tol_16)
            out.append(EqnCase(f"{graph.name}:{n}:{e.op.name}", e.op, ins, args,
                               want.reshape(t.shape), tol))
    return out
