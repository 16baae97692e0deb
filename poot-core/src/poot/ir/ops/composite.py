"""Compiler-only composites. Each has the same meaning as the primitive chain it
replaces: `define` emits that chain, which the oracle evaluates and translation
validation compares against. A tracer cannot emit these.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from poot.dtypes import DType
from poot.errors import DtypeError
from poot.ir.ops.base import FLOATS, OpKind
from poot.ir.ops.compute import IndexedMatMul, MatMul, PackedDequant, check_sources, matmul_type
from poot.ir.ops.data import ArgTopK, DynamicUpdateSlice, Gather, ScatterUpdate
from poot.ir.ops.elementwise import Binary, BinaryOp, Cast, Iota, Select, Unary, UnaryOp
from poot.ir.ops.reduce import Reduce, ReduceOp
from poot.ir.ops.shape import Broadcast, Concat, Reshape, Slice, Transpose
from poot.ir.types import TensorType

if TYPE_CHECKING:  # pragma: no cover
    from poot.ir.packed import PackedWeight
    from poot.ir.graph import Graph

F32 = DType.F32
NEG_INF = float("-inf")


class Composite(OpKind):
    compiler_only: ClassVar[bool] = True
    composite: ClassVar[bool] = True


def _reshape(b, x, shape):
    """Reshape unless it would be a no-op (so the chain has no idle eqns)."""
    return x if tuple(x.type.shape) == tuple(shape) else b.eqn(Reshape(tuple(shape)), x)


def _swap_last(b, x):
    r = x.type.rank
    return b.eqn(Transpose(tuple(range(r - 2)) + (r - 1, r - 2)), x)


# -- regions ------------------------------------------------------------------------
@dataclass(frozen=True, eq=False, repr=False)
class Fused(Composite):
    """A pointwise region: operands are the body's parameters; result is its result."""

    body: Graph

    def params(self):
        return {"eqns": len(self.body.eqns())}

    def infer(self, ins: Sequence[TensorType]) -> TensorType:
        want = [self.body.type_of(v) for v in self.body.inputs()]
        if list(ins) != want:
            self.fail(f"region takes {want}", ins)
        return self.body.type_of(self.body.result())

    def define(self, b, ins):
        return b.inline(self.body, ins)


@dataclass(frozen=True, eq=False, repr=False)
class FusedRow(Fused):
    """A reduction-rooted row region (RMSNorm, softmax): reductions run along `axis`."""

    axis: int = -1

    def params(self):
        return {"eqns": len(self.body.eqns()), "axis": self.axis}


@dataclass(frozen=True, eq=False, repr=False)
class ContractionEpilogue(Composite):
    """A contraction `head` and the pointwise chain that consumes its result.

    Operands: the head's n_head operands, then the epilogue's extra inputs. The
    body's first parameter is the head's result, in the head's dtype (a BF16 head
    rounds to BF16 before the first step reads it); each body step rounds
    through its own dtype.
    """

    head: OpKind
    n_head: int
    body: Graph

    def params(self):
        return {"head": self.head, "eqns": len(self.body.eqns())}

    def infer(self, ins: Sequence[TensorType]) -> TensorType:
        h = self.head.infer(ins[: self.n_head])
        want = [self.body.type_of(v) for v in self.body.inputs()]
        if [h, *ins[self.n_head:]] != want:
            self.fail(f"epilogue takes {want}; head gives {h}", ins)
        return self.body.type_of(self.body.result())

    def define(self, b, ins):
        h = b.eqn(self.head, *ins[: self.n_head])
        return b.inline(self.body, [h, *ins[self.n_head:]])


@dataclass(frozen=True, eq=False, repr=False)
class GatedContraction(Composite):
    """A contraction `head` whose result's last axis is two halves [a | b] (a stacked gate
    and up projection) and the pointwise `body` that joins them, out = body(a, b, ...):
    half the head's last axis (SwiGLU's silu(a) * b). A decode GEMV computes each output
    from its two columns at once: no kernel and no buffer for the joined halves.

    Operands: the head's n_head operands, then the body's extra inputs. The body's first
    two parameters are the halves, in the head's dtype.
    """

    head: OpKind
    n_head: int
    body: Graph

    def params(self):
        return {"head": self.head, "n_head": self.n_head, "eqns": len(self.body.eqns())}

    def half(self, ins: Sequence[TensorType]) -> TensorType:
        h = self.head.infer(ins[: self.n_head])
        if h.rank < 1 or h.shape[-1] % 2:
            self.fail(f"the head's result {h} has no two halves of its last axis", ins)
        return TensorType(h.shape[:-1] + (h.shape[-1] // 2,), h.dtype)

    def infer(self, ins: Sequence[TensorType]) -> TensorType:
        half = self.half(ins)
        want = [self.body.type_of(v) for v in self.body.inputs()]
        if [half, half, *ins[self.n_head:]] != want:
            self.fail(f"the gate body takes {want}; the head's halves are {half}", ins)
        return self.body.type_of(self.body.result())

    def define(self, b, ins):
        n = self.half([x.type for x in ins]).shape[-1]
        h = b.eqn(self.head, *ins[: self.n_head])
        halves = [b.eqn(Slice(-1, 0, n), h), b.eqn(Slice(-1, n, 2 * n), h)]
        return b.inline(self.body, [*halves, *ins[self.n_head:]])


@dataclass(frozen=True, eq=False, repr=False)
class ContractionPrologue(Composite):
    """A contraction `head` whose activation is a pointwise region of the operands.

    Operands: the body's first parameter, then the head's other n_head - 1 operands (its
    weight), then the body's other parameters; every parameter has the activation's
    shape. The head contracts the body's result (a decode step's SwiGLU of the gate and up
    rows read by the down projection: no kernel or buffer between them).
    """

    head: OpKind
    n_head: int
    body: Graph

    def params(self):
        return {"head": self.head, "eqns": len(self.body.eqns())}

    def split(self, ins):
        """(the body's operands, the head's operands after its activation)."""
        return [ins[0], *ins[self.n_head:]], list(ins[1:self.n_head])

    def infer(self, ins: Sequence[TensorType]) -> TensorType:
        pro, rest = self.split(ins)
        want = [self.body.type_of(v) for v in self.body.inputs()]
        act = self.body.type_of(self.body.result())
        if pro != want or any(t != act for t in want):
            self.fail(f"prologue takes {want}, each of its result's type {act}", ins)
        return self.head.infer([act, *rest])

    def define(self, b, ins):
        pro, rest = self.split(ins)
        return b.eqn(self.head, b.inline(self.body, pro), *rest)


# -- attention ------------------------------------------------------------------------
def attention_chain(b, q, k, v, mask, scale: float, sink=None):
    """The masked-softmax chain between two matmuls, with GQA by reshaping q.

    q [..., Hq, T, D], k [..., Hkv, S, D], v [..., Hkv, S, Dv], mask broadcastable
    to [..., T, S] (additive: 0 or -inf). This is exactly what `poot.ops.attention_masked`
    records, so the attention rewrite can match it and this definition restates it.
    `sink` [Hq] (gpt-oss): a learned logit per head that joins each softmax's denominator
    and weights no value, exp(s_j - m) / (exp(sink - m) + sum_k exp(s_k - m)) with m the
    max over the scores and the sink (SinkAttention's definition); the chain stays
    primitives where the device declares no SinkAttention.
    """
    *lead, hq, t, d = q.type.shape
    hkv, s = k.type.shape[-3], k.type.shape[-2]
    g = hq // hkv
    # a 16-bit KV read by an f32 query (an f16 cache): widened first, then today's chain
    k, v = (x if x.type.dtype is q.type.dtype else b.eqn(Cast(q.type.dtype), x) for x in (k, v))
    lead = tuple(lead)
    mr = mask.type.rank
    if 2 < mr <= q.type.rank and any(n != 1 for n in mask.type.shape[:-2]):
        # the scores are [..., Hkv, G, T, S]: a mask [..., H or 1, T, S] must split its head
        # axis the way q's was split, or its batch axes would line up with Hkv
        ms = (1,) * (q.type.rank - mr) + tuple(mask.type.shape)
        mask = b.eqn(Reshape(ms[:-3] + ((hkv, g) if ms[-3] == hq else (1, 1)) + ms[-2:]),
                     mask)
    qg = _reshape(b, q, lead + (hkv, g * t, d))
    sc = b.eqn(MatMul(), qg, _swap_last(b, k))                      # [..., Hkv, G*T, S]
    sc = b.eqn(Binary(BinaryOp.Mul), sc, b.lit(scale, sc.type.dtype))
    sc = _reshape(b, sc, lead + (hkv, g, t, s))
    sc = b.eqn(Binary(BinaryOp.Add), sc, mask)
    m = b.eqn(Reduce(ReduceOp.Max, -1, True), sc)
    if sink is not None:        # per head [Hkv, G, 1, 1], as q's heads were split
        sink = _reshape(b, sink, (hkv, g, 1, 1))
        m = b.eqn(Binary(BinaryOp.Max), m, sink)
    ex = b.eqn(Unary(UnaryOp.Exp), b.eqn(Binary(BinaryOp.Sub), sc, m))
    den = b.eqn(Reduce(ReduceOp.Sum, -1, True), ex)
    if sink is not None:
        den = b.eqn(Binary(BinaryOp.Add), den,
                    b.eqn(Unary(UnaryOp.Exp), b.eqn(Binary(BinaryOp.Sub), sink, m)))
    p = b.eqn(Binary(BinaryOp.Div), ex, den)
    p = _reshape(b, p, lead + (hkv, g * t, s))
    o = b.eqn(MatMul(), p, v)                                       # [..., Hkv, G*T, Dv]
    return _reshape(b, o, lead + (hq, t, v.type.shape[-1]))


#: the K/V dtypes an F32 query reads directly, each widened to F32 first (an f16 KV cache)
KV_WIDENED = (DType.F16, DType.BF16)


def kv_dtypes(q: DType) -> tuple[DType, ...]:
    """The dtypes an attention's k and v may have with a query of dtype `q`."""
    return (q, *KV_WIDENED) if q is F32 else (q,)


def _attention_type(op: OpKind, ins: Sequence[TensorType]) -> TensorType:
    q, k, v, mask = ins[:4]
    if q.dtype not in FLOATS or k.dtype != v.dtype or k.dtype not in kv_dtypes(q.dtype):
        op.fail(f"k and v must share one dtype, q's or (for an f32 q) one of "
                f"{', '.join(map(str, KV_WIDENED))}", ins, DtypeError)
    if q.rank < 3 or k.rank != q.rank or v.rank != q.rank:
        op.fail("q, k, v must be [..., H, T, D] of one rank", ins)
    hq, t, d = q.shape[-3:]
    hkv, s, dk = k.shape[-3:]
    if dk != d or v.shape[-3:-1] != (hkv, s) or hkv == 0 or hq % hkv:
        op.fail("k must be [..., Hkv, S, D], v [..., Hkv, S, Dv], Hq a multiple of Hkv", ins)
    if any(n not in (1, w) for x in (k, v) for n, w in zip(x.shape[:-3], q.shape[:-3])):
        op.fail(f"k and v's leading axes must be 1 or q's {q.shape[:-3]}", ins)
    # a mask of rank <= q.rank lines up with q: [..., Hq or 1, T, S] (the chain splits its
    # head axis like q's); a mask of rank q.rank + 1 is already in the grouped scores' form
    # [..., Hkv, G, T, S] (a per-sequence mask [B, 1, 1, T, S] of a paged batch)
    scores = q.shape[:-3] + (hkv, hq // hkv, t, s)
    if mask.rank > len(scores) or any(
            m not in (1, w) for m, w in zip(reversed(mask.shape), (s, t))):
        op.fail(f"mask must broadcast to [T={t}, S={s}] (or the grouped scores {scores})", ins)
    if mask.rank == len(scores):
        if any(m not in (1, w) for m, w in zip(mask.shape, scores)):
            op.fail(f"a mask of q's rank + 1 must broadcast to the grouped scores {scores}",
                    ins)
    elif mask.rank > 2:
        ms = (1,) * (q.rank - mask.rank) + mask.shape
        if ms[-3] not in (1, hq) or any(
                m not in (1, w) for m, w in zip(ms[:-3], q.shape[:-3])):
            op.fail(f"mask must broadcast to q's [..., Hq={hq}] axes, then [T, S]", ins)
    return TensorType(q.shape[:-1] + (v.shape[-1],), q.dtype)


@dataclass(frozen=True, repr=False)
class Attention(Composite):
    """softmax(q k^T * scale + mask) v with GQA; operands q, k, v, mask.

    k and v have q's dtype, or (an f32 q) both F16 or both BF16: widened to f32 first, so
    a 16-bit KV cache is read in place. Online softmax, no score matrix: the planner
    generates its kernel.
    """

    scale: float
    arity: ClassVar[int] = 4
    deciding: ClassVar[str] = "kv"
    needs: ClassVar[str] = "dot"

    def infer(self, ins):
        self.check_arity(ins)
        return _attention_type(self, ins)

    def define(self, b, ins):
        return attention_chain(b, *ins, self.scale)


def _token_major(t: TensorType) -> TensorType:
    """t [..., A, B, D] as [..., B, A, D] (token-major rows <-> head-major)."""
    return TensorType(t.shape[:-3] + (t.shape[-2], t.shape[-3], t.shape[-1]), t.dtype)


def _swap_rows(b, x):
    r = x.type.rank
    return b.eqn(Transpose(tuple(range(r - 3)) + (r - 2, r - 3, r - 1)), x)


@dataclass(frozen=True, repr=False)
class TokenMajorAttention(Composite):
    """Attention over token-major rows: q [..., T, Hq, D], k, v and mask as Attention's,
    result [..., T, Hq, Dv]: Transpose(Attention(Transpose(q))), each swapping the head and
    token axes. A step of several tokens reads its query rows and writes its output where
    they are, with no Transpose kernels around the attention."""

    scale: float
    arity: ClassVar[int] = 4
    deciding: ClassVar[str] = "kv"
    needs: ClassVar[str] = "dot"

    def infer(self, ins):
        self.check_arity(ins)
        if ins[0].rank < 3:
            self.fail("q must be [..., T, Hq, D]", ins)
        return _token_major(_attention_type(self, [_token_major(ins[0]), *ins[1:]]))

    def define(self, b, ins):
        q, k, v, mask = ins
        return _swap_rows(b, attention_chain(b, _swap_rows(b, q), k, v, mask, self.scale))


@dataclass(frozen=True, repr=False)
class SinkAttention(Composite):
    """Attention with a learned logit per query head in each softmax's denominator (gpt-oss's
    sinks); operands q, k, v, mask as Attention's, then sinks [Hq] of q's dtype.

    Its own op so a device declares it apart from Attention: a kernel without the sink term
    is never handed one. Where none is declared the chain stays primitives.
    """

    scale: float
    arity: ClassVar[int] = 5
    deciding: ClassVar[str] = "kv"
    needs: ClassVar[str] = "dot"

    def infer(self, ins):
        self.check_arity(ins)
        out = _attention_type(self, ins[:4])
        q, sinks = ins[0], ins[4]
        if sinks.shape != (q.shape[-3],) or sinks.dtype != q.dtype:
            self.fail(f"sinks must be [Hq={q.shape[-3]}] of q's dtype", ins)
        return out

    def define(self, b, ins):
        return attention_chain(b, *ins[:4], self.scale, ins[4])


@dataclass(frozen=True, repr=False)
class PagedAttention(Composite):
    """Attention over a paged KV pool, read through each sequence's slot map: operands q
    [B, Hq, T, D], k_pool [P, Hkv, D], v_pool [P, Hkv, Dv], slot_map [B, S] I32 (the pool
    slot of each of a sequence's S positions), mask (as Attention's, against [B, Hkv, S]).

    The same as Attention on k = Transpose(Gather(k_pool, slot_map), (0, 2, 1, 3)) and v
    alike; its kernel reads the pool's rows through the slot map, so no gathered copy of
    the keys is made.
    """

    scale: float
    arity: ClassVar[int] = 5
    deciding: ClassVar[str] = "kv"
    needs: ClassVar[str] = "dot"

    def infer(self, ins):
        self.check_arity(ins)
        q, kp, vp, smap, mask = ins
        self.need_dtype(smap, (DType.I32,), "slot_map")
        if q.rank != 4 or kp.rank != 3 or vp.rank != 3 or smap.rank != 2 or \
                smap.shape[0] != q.shape[0] or kp.shape[:2] != vp.shape[:2]:
            self.fail("expected q [B, Hq, T, D], k_pool [P, Hkv, D], v_pool [P, Hkv, Dv], "
                      "slot_map [B, S]", ins)
        return _attention_type(self, [q, *_gathered(kp, vp, smap), mask])

    def define(self, b, ins):
        q, kp, vp, smap, mask = ins
        k, v = (b.eqn(Transpose((0, 2, 1, 3)), b.eqn(Gather(0), x, smap)) for x in (kp, vp))
        return attention_chain(b, q, k, v, mask, self.scale)


def _gathered(kp: TensorType, vp: TensorType, smap: TensorType) -> list[TensorType]:
    """The types of the keys and values PagedAttention reads: [B, Hkv, S, D or Dv]."""
    (bsz, s), hkv = smap.shape, kp.shape[1]
    return [TensorType((bsz, hkv, s, x.shape[2]), x.dtype) for x in (kp, vp)]


@dataclass(frozen=True, repr=False)
class Rope(Composite):
    """Rotate-half RoPE on the first `rot` features: operands x [..., D], cos, sin
    (broadcastable to [..., rot/2]); features past `rot` pass through."""

    rot: int
    arity: ClassVar[int] = 3
    deciding: ClassVar[str] = "operand"
    needs: ClassVar[str] = "arith"

    def infer(self, ins):
        self.check_arity(ins)
        x, cos, sin = ins
        if self.rot % 2 or not 0 < self.rot <= x.shape[-1]:
            self.fail(f"rot={self.rot} must be even and <= {x.shape[-1]}", ins)
        half = TensorType(x.shape[:-1] + (self.rot // 2,), x.dtype)
        for t in (cos, sin):
            if t.dtype != x.dtype or t.rank > half.rank or any(
                    a not in (1, h) for a, h in zip(reversed(t.shape), reversed(half.shape))):
                self.fail(f"cos/sin must broadcast to {half}", ins)
        return x

    def define(self, b, ins):
        x, cos, sin = ins
        h, d = self.rot // 2, x.type.shape[-1]
        x1 = b.eqn(Slice(-1, 0, h), x)
        x2 = b.eqn(Slice(-1, h, self.rot), x)
        mul, sub, add = Binary(BinaryOp.Mul), Binary(BinaryOp.Sub), Binary(BinaryOp.Add)
        lo = b.eqn(sub, b.eqn(mul, x1, cos), b.eqn(mul, x2, sin))
        hi = b.eqn(add, b.eqn(mul, x1, sin), b.eqn(mul, x2, cos))
        parts = [lo, hi] + ([b.eqn(Slice(-1, self.rot, d), x)] if self.rot < d else [])
        return b.eqn(Concat(-1), *parts)


@dataclass(frozen=True, repr=False)
class RopeScatter(Composite):
    """A KV write of rotated keys: ScatterUpdate(base, Rope{rot}(x, cos, sin), slots) with
    x's leading axes read as base's rows. Operands base [P, ...], x [..., D] whose trailing
    axes are base's row shape, cos, sin (as Rope's), slots [N] I32 (N: x's rows). In
    place on the donated base, as ScatterUpdate."""

    rot: int
    arity: ClassVar[int] = 5
    deciding: ClassVar[str] = "operand"
    needs: ClassVar[str] = "arith"

    def infer(self, ins):
        self.check_arity(ins)
        base, x, cos, sin, slots = ins
        Rope(self.rot).infer([x, cos, sin])
        row = base.shape[1:]
        if base.rank < 1 or x.rank < len(row) or x.shape[x.rank - len(row):] != row:
            self.fail(f"x's trailing axes must be base's rows {row}", ins)
        n = x.size // max(1, math.prod(row))
        return ScatterUpdate().infer([base, TensorType((n,) + row, x.dtype), slots])

    def define(self, b, ins):
        base, x, cos, sin, slots = ins
        row = base.type.shape[1:]
        y = b.eqn(Rope(self.rot), x, cos, sin)
        n = x.type.size // max(1, math.prod(row))
        return b.eqn(ScatterUpdate(), base, _reshape(b, y, (n,) + row), slots)


@dataclass(frozen=True, repr=False)
class RopeUpdateSlice(Composite):
    """A dense KV write of rotated keys: DynamicUpdateSlice{axis}(base, Reshape(Rope{rot}(x,
    cos, sin)), index), x's elements in order filling the update block (base's shape with
    `axis` holding x.size / base's other extents); rounded to base's float dtype first
    (Cast) where x's differs (an f16 cache of f32 keys). Operands base, x [..., D], cos, sin
    (as Rope's), index (I32, one element; clamped as DynamicUpdateSlice's). In place on the
    donated base, as DynamicUpdateSlice. `tokens_first`: x's elements are the block's
    with `axis` first (a step's keys token by token, [T, Hkv, D], into a cache [Hkv, S, D]):
    Reshape to that order, then the Transpose moving its first axis to `axis`."""

    rot: int
    axis: int
    tokens_first: bool = False
    arity: ClassVar[int] = 5
    deciding: ClassVar[str] = "operand"
    needs: ClassVar[str] = "arith"

    def infer(self, ins):
        self.check_arity(ins)
        base, x, cos, sin, index = ins
        Rope(self.rot).infer([x, cos, sin])
        if x.dtype != base.dtype and not (x.dtype.is_float and base.dtype.is_float):
            self.fail("x and base must share a dtype or both be floats", ins, DtypeError)
        return DynamicUpdateSlice(self.axis).infer([base, self.update_type(base, x), index])

    def update_type(self, base: TensorType, x: TensorType) -> TensorType:
        return _update_type(self, base, x)

    def define(self, b, ins):
        base, x, cos, sin, index = ins
        y = b.eqn(Rope(self.rot), x, cos, sin)
        if x.type.dtype != base.type.dtype:
            y = b.eqn(Cast(base.type.dtype), y)
        upd = self.update_type(base.type, x.type).shape
        return b.eqn(DynamicUpdateSlice(self.axis), base,
                     _from_order(b, y, upd, self.token_order(upd)), index)

    def token_order(self, upd: Sequence[int]) -> tuple[int, ...]:
        """The update block's axes in the order x holds its elements (`tokens_first`:
        `axis` first, else as they are)."""
        a = self.norm_axis(self.axis, len(upd))
        return axis_first(a, len(upd)) if self.tokens_first else tuple(range(len(upd)))


@dataclass(frozen=True, repr=False)
class FreshKVAttention(Composite):
    """Attention over a dense KV cache with this step's keys and values written in, read
    from where the projection left them instead of after the write:
    Attention(Rope{rot}(q, cos, sin), DynamicUpdateSlice{-2}(k_cache, Rope{rot}(k_new, cos,
    sin), index), DynamicUpdateSlice{-2}(v_cache, v_new, index), mask), the new rows rounded
    to the cache's dtype first (Cast) where theirs differs. Operands q [..., Hq, T, D]
    (not rotated), k_cache [..., Hkv, S, D], v_cache [..., Hkv, S, Dv], mask (as
    Attention's), k_new [..., Hkv, T, D] (not rotated), v_new [..., Hkv, T, Dv], cos, sin
    (broadcastable to q's and k_new's [..., rot/2]), index (I32, one element; clamped as
    DynamicUpdateSlice's). The cache is only read: the writes stay their own ops and may
    run beside the attention's readers, so a layer's step waits for the rotation and the
    writes no more."""

    scale: float
    rot: int
    arity: ClassVar[int] = 9
    deciding: ClassVar[str] = "kv"
    needs: ClassVar[str] = "dot"

    def infer(self, ins):
        self.check_arity(ins)
        q, kc, vc, mask, kn, vn, cos, sin, index = ins
        Rope(self.rot).infer([q, cos, sin])
        Rope(self.rot).infer([kn, cos, sin])
        for new, cache in ((kn, kc), (vn, vc)):
            if new.rank != cache.rank or new.shape[:-2] != cache.shape[:-2] or \
                    new.shape[-1] != cache.shape[-1] or new.shape[-2] != q.shape[-2]:
                self.fail("k_new and v_new must be the caches' [..., Hkv, T, D] with q's T",
                          ins)
            if new.dtype != cache.dtype and not (new.dtype.is_float and cache.dtype.is_float):
                self.fail("new rows and their cache must share a dtype or both be floats",
                          ins, DtypeError)
        if index.dtype != DType.I32 or index.size != 1:
            self.fail("index must be one I32 element", ins, DtypeError)
        return _attention_type(self, [q, kc, vc, mask])

    def define(self, b, ins):
        q, kc, vc, mask, kn, vn, cos, sin, index = ins
        rows = []
        for new, cache, rotate in ((kn, kc, True), (vn, vc, False)):
            y = b.eqn(Rope(self.rot), new, cos, sin) if rotate else new
            if new.type.dtype != cache.type.dtype:
                y = b.eqn(Cast(cache.type.dtype), y)
            rows.append(b.eqn(DynamicUpdateSlice(cache.type.rank - 2), cache, y, index))
        return attention_chain(b, b.eqn(Rope(self.rot), q, cos, sin), *rows, mask, self.scale)


def _update_type(op, base: TensorType, x: TensorType) -> TensorType:
    """The block x fills, in base's dtype: base's shape with `op.axis` sized to hold x's
    elements."""
    a = op.norm_axis(op.axis, base.rank, [base, x])
    other = math.prod(base.shape[:a] + base.shape[a + 1:])
    if not other or x.size % other:
        op.fail(f"x's {x.size} elements are no whole number of base's slices along axis {a}",
                [base, x])
    return TensorType(base.shape[:a] + (x.size // other,) + base.shape[a + 1:], base.dtype)


def axis_first(a: int, rank: int) -> tuple[int, ...]:
    """Axes 0..rank-1 with `a` moved first."""
    return (a,) + tuple(i for i in range(rank) if i != a)


def _from_order(b, y, upd: Sequence[int], order: tuple[int, ...]):
    """y's elements, in the block's axes taken in `order`, as the block `upd`: Reshape to
    that order, then the Transpose putting each axis back (none where the order is the
    block's)."""
    y = _reshape(b, y, tuple(upd[i] for i in order))
    if order == tuple(range(len(upd))):
        return y
    return b.eqn(Transpose(tuple(order.index(i) for i in range(len(upd)))), y)


@dataclass(frozen=True, repr=False)
class TransposedUpdateSlice(Composite):
    """A dense KV write of a step's rows token by token: DynamicUpdateSlice{axis}(base,
    Transpose(Reshape(x)), index), x's elements being the update block's with `axis` first
    (values [T, Hkv, D] into a cache [Hkv, S, D]; the block is base's shape with `axis`
    holding x.size / base's other extents); rounded to base's float dtype first (Cast)
    where x's differs. Operands base, x, index (I32, one element; clamped as
    DynamicUpdateSlice's). In place on the donated base, as DynamicUpdateSlice."""

    axis: int
    arity: ClassVar[int] = 3
    deciding: ClassVar[str] = "operand"

    def infer(self, ins):
        self.check_arity(ins)
        base, x, index = ins
        if x.dtype != base.dtype and not (x.dtype.is_float and base.dtype.is_float):
            self.fail("x and base must share a dtype or both be floats", ins, DtypeError)
        return DynamicUpdateSlice(self.axis).infer([base, self.update_type(base, x), index])

    def define(self, b, ins):
        base, x, index = ins
        y = x if x.type.dtype == base.type.dtype else b.eqn(Cast(base.type.dtype), x)
        upd = self.update_type(base.type, x.type).shape
        return b.eqn(DynamicUpdateSlice(self.axis), base,
                     _from_order(b, y, upd, self.token_order(upd)), index)

    def update_type(self, base: TensorType, x: TensorType) -> TensorType:
        return _update_type(self, base, x)

    def token_order(self, upd: Sequence[int]) -> tuple[int, ...]:
        """The update block's axes in the order x holds its elements: `axis` first."""
        return axis_first(self.norm_axis(self.axis, len(upd)), len(upd))


@dataclass(frozen=True, repr=False)
class BlockTopK(Composite):
    """Sparse-attention block selection: q [H, T, D], k [H, S, D] -> [H, T, k] I32.

    Block scores are q against the sum of each block of `block` keys; the k best
    blocks per query, best first (stable ties).
    """

    block: int
    k: int
    arity: ClassVar[int] = 2
    deciding: ClassVar[str] = "operand"
    needs: ClassVar[str] = "dot"

    def infer(self, ins):
        self.check_arity(ins)
        q, kk = ins
        if q.rank != 3 or kk.rank != 3 or q.shape[0] != kk.shape[0] or q.shape[2] != kk.shape[2]:
            self.fail("expected q [H, T, D], k [H, S, D]", ins)
        if kk.shape[1] % self.block or not 1 <= self.k <= kk.shape[1] // self.block:
            self.fail(f"S must be a multiple of block={self.block} with k <= S/block", ins)
        return TensorType((q.shape[0], q.shape[1], self.k), DType.I32)

    def define(self, b, ins):
        q, kk = ins
        h, s, d = kk.type.shape
        blocks = b.eqn(Reshape((h, s // self.block, self.block, d)), kk)
        pooled = b.eqn(Reduce(ReduceOp.Sum, 2), blocks)
        scores = b.eqn(MatMul(), q, _swap_last(b, pooled))
        return b.eqn(ArgTopK(self.k), scores)


@dataclass(frozen=True, repr=False)
class SelectedAttention(Composite):
    """Attention over the selected key blocks: q, k, v [H, *, *], blocks [H, T, kb] I32,
    mask [T, S]; keys outside the selected blocks are masked out."""

    block: int
    scale: float
    arity: ClassVar[int] = 5
    deciding: ClassVar[str] = "operand"
    needs: ClassVar[str] = "dot"

    def infer(self, ins):
        self.check_arity(ins)
        out = _attention_type(self, [ins[0], ins[1], ins[2], ins[4]])
        if ins[1].dtype != ins[0].dtype:
            self.fail("q, k, v must share one float dtype", ins, DtypeError)
        blocks = ins[3]
        self.need_dtype(blocks, (DType.I32,), "blocks")
        q, k = ins[0], ins[1]
        if q.rank != 3 or blocks.shape[:2] != q.shape[:2] or q.shape[0] != k.shape[0]:
            self.fail("expected q [H, T, D] with blocks [H, T, kb] and no GQA", ins)
        return out

    def define(self, b, ins):
        q, k, v, blocks, mask = ins
        h, t, kb = blocks.type.shape
        s = k.type.shape[1]
        key_pos = b.eqn(Iota((s,), 0, DType.I32))
        blk = b.eqn(Binary(BinaryOp.Div), key_pos, b.lit(self.block, DType.I32))
        sel4 = b.eqn(Reshape((h, t, kb, 1)), blocks)
        ge1 = b.eqn(Binary(BinaryOp.Ge), sel4, blk)
        ge2 = b.eqn(Binary(BinaryOp.Ge), blk, sel4)
        eq = b.eqn(Binary(BinaryOp.Mul), ge1, ge2)                      # [H, T, kb, S]
        keep = b.eqn(Reduce(ReduceOp.Max, 2), eq)                       # [H, T, S]
        full = b.eqn(Broadcast((h, t, s)), mask)
        ninf = b.eqn(Broadcast((h, t, s)), b.lit(NEG_INF, mask.type.dtype))
        m = b.eqn(Select(), keep, full, ninf)
        return attention_chain(b, q, k, v, b.eqn(Reshape((h, 1, t, s)), m), self.scale)


# -- contractions -----------------------------------------------------------------------
@dataclass(frozen=True, repr=False)
class PackedContraction(Composite):
    """a [..., M, K] F32 against a packed [N, K] weight -> [..., M, N] F32.
    Operands: a, then the weight's sources. Decodes weight values as it consumes them."""
    deciding: ClassVar[str] = "format"

    weight: PackedWeight

    def infer(self, ins):
        a, *src = ins
        check_sources(self, self.weight, src)
        self.need_dtype(a, (F32,), "activation")
        return matmul_type(self, a, TensorType(self.weight.shape[::-1], F32))

    def define(self, b, ins):
        a, *src = ins
        w = b.eqn(PackedDequant(self.weight), *src)
        return b.eqn(MatMul(), a, b.eqn(Transpose((1, 0)), w))


@dataclass(frozen=True, repr=False)
class NormedPackedContraction(Composite):
    """RMSNorm, then a packed contraction: rms_norm(x, g, eps) [..., M, K] against a packed
    [N, K] weight -> [..., M, N] F32. Operands: x [..., M, K] F32, g [K] F32, then the
    weight's sources. The norm is the seven eqns of poot.ops.rms_norm: a decode GEMV
    takes each row's sum of squares with the activations it reads anyway and divides its
    dot products by the root, so no kernel or buffer stands between norm and weight."""
    deciding: ClassVar[str] = "format"

    weight: PackedWeight
    eps: float

    def infer(self, ins):
        if len(ins) < 2:
            self.fail("takes x, g and the weight's sources", ins)
        x, g, *src = ins
        self.need_dtype(x, (F32,), "activation")
        if x.rank < 2:
            self.fail("activation must have rank >= 2", ins)
        if g != TensorType((x.shape[-1],), F32):
            self.fail(f"norm weight must be f32[{x.shape[-1]}], got {g}", ins)
        return PackedContraction(self.weight).infer([x, *src])

    def define(self, b, ins):
        x, g, *src = ins
        return b.eqn(PackedContraction(self.weight), rms_norm_chain(b, x, g, self.eps), *src)


def rms_norm_chain(b, x, g, eps: float):
    """x / sqrt(mean(x^2, last axis) + eps) * g in poot.ops.rms_norm's seven eqns."""
    mul = Binary(BinaryOp.Mul)
    ss = b.eqn(Reduce(ReduceOp.Sum, -1, True), b.eqn(mul, x, x))
    mean = b.eqn(mul, ss, b.lit(1.0 / x.type.shape[-1], F32))
    den = b.eqn(Unary(UnaryOp.Sqrt), b.eqn(Binary(BinaryOp.Add), mean, b.lit(eps, F32)))
    return b.eqn(mul, b.eqn(Binary(BinaryOp.Div), x, den), g)


@dataclass(frozen=True, repr=False)
class PackedRowGather(Composite):
    """Rows `ids` of a packed [N, K] table, decoded to F32. Operands: ids, sources."""
    deciding: ClassVar[str] = "format"

    weight: PackedWeight

    def infer(self, ins):
        ids, *src = ins
        check_sources(self, self.weight, src)
        self.need_dtype(ids, (DType.I32,), "ids")
        return TensorType(ids.shape + (self.weight.shape[1],), F32)

    def define(self, b, ins):
        ids, *src = ins
        return b.eqn(Gather(0), b.eqn(PackedDequant(self.weight), *src), ids)


@dataclass(frozen=True, repr=False)
class IndexedPackedContraction(Composite):
    """MoE: x [M, K] F32, idx [M] I32, then the sources of a packed expert stack
    [E*N, K]; row m contracts with expert idx[m]. Decodes only selected experts."""
    deciding: ClassVar[str] = "format"

    weight: PackedWeight
    experts: int

    def infer(self, ins):
        x, idx, *src = ins
        check_sources(self, self.weight, src)
        n_all, k = self.weight.shape
        if n_all % self.experts:
            self.fail(f"{n_all} rows do not split into {self.experts} experts", ins)
        stack = TensorType((self.experts, k, n_all // self.experts), F32)
        return IndexedMatMul().infer([x, stack, idx])

    def define(self, b, ins):
        x, idx, *src = ins
        n_all, k = self.weight.shape
        w = b.eqn(PackedDequant(self.weight), *src)
        w = b.eqn(Transpose((0, 2, 1)), b.eqn(Reshape((self.experts, n_all // self.experts, k)), w))
        return b.eqn(IndexedMatMul(), x, w, idx)





def dense_weight_f32(b, w, shape_nk: tuple[int, int]):
    """A checkpoint weight widened to F32 [N, K]: bf16/f16/f32 cast, or u32 f16 words."""
    if w.type.dtype is DType.U32:
        from poot.ir.packed import PackedWeight

        return b.eqn(PackedDequant(PackedWeight("dense:f16words", shape_nk)), w)
    return b.eqn(Cast(F32), w)


def _dense_nk(op: OpKind, w: TensorType, ins) -> tuple[int, int]:
    if w.rank != 2:
        op.fail("weight must be [N, K]", ins)
    if w.dtype is DType.U32:
        return (w.shape[0], 2 * w.shape[1])
    if w.dtype not in (DType.BF16, DType.F16, F32):
        op.fail(f"weight dtype {w.dtype} is not bf16, f16, f32 or u32 f16 words", ins, DtypeError)
    return w.shape


@dataclass(frozen=True, repr=False)
class DenseContraction(Composite):
    """a [..., M, K] F32 against a checkpoint weight in [N, K] order -> [..., M, N] F32.
    The weight is bf16, f16, f32, or f16 held as u32 words [N, K/2]; never transposed."""

    arity: ClassVar[int] = 2
    deciding: ClassVar[str] = "weight"
    needs: ClassVar[str] = "dot"

    def infer(self, ins):
        self.check_arity(ins)
        a, w = ins
        self.need_dtype(a, (F32,), "activation")
        n, k = _dense_nk(self, w, ins)
        return matmul_type(self, a, TensorType((k, n), F32))

    def define(self, b, ins):
        a, w = ins
        wf = dense_weight_f32(b, w, _dense_nk(self, w.type, ins))
        return b.eqn(MatMul(), a, b.eqn(Transpose((1, 0)), wf))


@dataclass(frozen=True, repr=False)
class NormedDenseContraction(Composite):
    """RMSNorm, then a dense contraction: rms_norm(x, g, eps) [..., M, K] against a
    checkpoint weight [N, K] -> [..., M, N] F32. Operands: x [..., M, K] F32, the weight
    (second, as DenseContraction's: its dtype decides), g [K] F32. The norm is the seven
    eqns of poot.ops.rms_norm; a decode GEMV sums the squares of the activations it reads
    anyway and divides each dot product by the root (NormedPackedContraction's scheme)."""

    arity: ClassVar[int] = 3
    deciding: ClassVar[str] = "weight"
    needs: ClassVar[str] = "dot"

    eps: float

    def infer(self, ins):
        self.check_arity(ins)
        x, w, g = ins
        if x.rank < 2:
            self.fail("activation must have rank >= 2", ins)
        if g != TensorType((x.shape[-1],), F32):
            self.fail(f"norm weight must be f32[{x.shape[-1]}], got {g}", ins)
        return DenseContraction().infer([x, w])

    def define(self, b, ins):
        x, w, g = ins
        return b.eqn(DenseContraction(), rms_norm_chain(b, x, g, self.eps), w)


@dataclass(frozen=True, repr=False)
class DenseRowGather(Composite):
    """Rows `ids` of a bf16 table [V, K], widened to F32. Operands: table, ids."""

    arity: ClassVar[int] = 2
    deciding: ClassVar[str] = "operand"

    def infer(self, ins):
        self.check_arity(ins)
        table, ids = ins
        self.need_dtype(table, (DType.BF16,), "table")
        return Gather(0).infer(ins).with_dtype(F32)

    def define(self, b, ins):
        return b.eqn(Cast(F32), b.eqn(Gather(0), *ins))


@dataclass(frozen=True, repr=False)
class GroupedDenseContraction(Composite):
    """a [G, M, K] F32 against a bf16 weight [G*N, K] read as G blocks of N rows."""

    groups: int
    arity: ClassVar[int] = 2
    deciding: ClassVar[str] = "weight"
    needs: ClassVar[str] = "dot"

    def infer(self, ins):
        self.check_arity(ins)
        a, w = ins
        self.need_dtype(a, (F32,), "activation")
        self.need_dtype(w, (DType.BF16,), "weight")
        g = self.groups
        if a.rank != 3 or a.shape[0] != g or w.rank != 2 or w.shape[0] % g or \
                w.shape[1] != a.shape[2]:
            self.fail(f"expected a [{g}, M, K] and w [{g}*N, K]", ins)
        return TensorType((g, a.shape[1], w.shape[0] // g), F32)

    def define(self, b, ins):
        a, w = ins
        gn, k = w.type.shape
        w3 = b.eqn(Reshape((self.groups, gn // self.groups, k)), w)
        wt = b.eqn(Cast(F32), b.eqn(Transpose((0, 2, 1)), w3))
        return b.eqn(MatMul(), a, wt)


# -- collectives ----------------------------------------------------------------------------
@dataclass(frozen=True, repr=False)
class AllReduce(Composite):
    """Sum across `ranks` tensor-parallel ranks. A cut between stages."""

    ranks: int
    arity: ClassVar[int] = 1
    deciding: ClassVar[str] = "operand"

    def infer(self, ins):
        self.check_arity(ins)
        return ins[0]

    def define(self, b, ins):
        from poot.errors import UnsupportedOp

        if self.ranks != 1:
            raise UnsupportedOp(f"AllReduce over {self.ranks} ranks needs the other ranks' "
                                "data; a single-process evaluator cannot compute it",
                                op="AllReduce", backend="reference")
        return ins[0]


@dataclass(frozen=True, repr=False)
class AllGather(Composite):
    """Gather `ranks` shards along `axis` (multiplying it by ranks). A cut between stages."""

    ranks: int
    axis: int = 0
    arity: ClassVar[int] = 1
    deciding: ClassVar[str] = "operand"

    def infer(self, ins):
        self.check_arity(ins)
        (x,) = ins
        a = self.norm_axis(self.axis, x.rank, ins)
        shape = list(x.shape)
        shape[a] *= self.ranks
        return TensorType(tuple(shape), x.dtype)

    def define(self, b, ins):
        from poot.errors import UnsupportedOp

        if self.ranks != 1:
            raise UnsupportedOp(f"AllGather over {self.ranks} ranks is refused by the "
                                "reference evaluator", op="AllGather", backend="reference")
        return ins[0]


#: the collectives: cuts between stages, run by a runtime's communicator
COLLECTIVES = (AllReduce, AllGather)
