"""The attention rewrite: the masked-softmax chain between two matmuls (exactly
poot.ir.ops.attention_chain, what poot.ops.attention_masked records), for decode and
prefill, with GQA, becomes one Attention(scale) with operands [q, k, v, mask].

Where k and v are a paged pool's rows read through one slot map (each Transpose(
Gather(pool, slot_map), (0, 2, 1, 3)), as the paged decoder reads its KV), the chain and
both reads become one PagedAttention(scale) [q, k_pool, v_pool, slot_map, mask], so the
kernel reads the pool directly; a target without PagedAttention gets Attention over the
gathered copies.

A chain whose softmax also takes a sink logit per head (gpt-oss: its max and its
denominator include it) becomes SinkAttention(scale) [q, k, v, mask, sinks] where the
target declares it, and stays primitives elsewhere; over a q8_0 cache's read,
Q8KVSinkAttention(scale) [q, k codes, k scales, v codes, v scales, mask, sinks] where
declared (there is no paged sink form).

Where k and v are each Cast(F32) of one 16-bit dtype (an f16 KV cache's read), the casts
fold into the composite's operands (an f32 q with f16 or bf16 k and v, docs/ir.md) when the
target declares that form (its table's entry for the keys' dtype), so no f32 copy of the
cache is made; else the casts stay and the composite reads their f32 results. Where k and v
are each q8_dequantize of codes and scales (a q8_0 KV cache's read, poot.ops.kv_decode),
the chain and both reads become Q8KVAttention(scale) [q, k codes, k scales, v codes,
v scales, mask] where the target declares it (PagedQ8KVAttention [q, the four pools,
slot_map, mask] where all four are pool rows read through one slot map); else the
dequantizations stay.

The policy decides (attention="never", shape limits) and the target must allow it.
"""
from __future__ import annotations

import itertools
from functools import partial

from poot.compiler.match import match_definition
from poot.compiler.rewrite import Rewriter
from poot.compiler.view import GraphView, NoMatch
from poot.dtypes import DType
from poot.ir.ops import (
    Attention,
    Binary,
    BinaryOp,
    Cast,
    Gather,
    MatMul,
    PagedAttention,
    PagedQ8KVAttention,
    Q8KVAttention,
    Q8KVSinkAttention,
    Reshape,
    SinkAttention,
    Transpose,
    Unary,
    UnaryOp,
)
from poot.ir.ops.composite import KV_WIDENED


def skip_reshape(view: GraphView, v):
    """The chain reshapes only where a shape changes: look through one Reshape if any."""
    e = view.producer(v)
    return view.value(e, 0) if e is not None and isinstance(e.op, Reshape) else v


def parts(view: GraphView, pv):
    """(scale, q options, k, v, mask options) read back from the output MatMul `pv`."""
    div = view.defined_by(skip_reshape(view, view.value(pv, 0)), Binary, "the softmax")
    ex = view.defined_by(div.inputs[0], Unary, "exp")
    sub = view.defined_by(ex.inputs[0], Binary, "scores - max")
    masked = view.defined_by(sub.inputs[0], Binary, "the masked scores")
    if (div.op.op, ex.op.op, sub.op.op, masked.op.op) != (
            BinaryOp.Div, UnaryOp.Exp, BinaryOp.Sub, BinaryOp.Add):
        raise NoMatch("not exp(scores + mask - max) / sum")
    sc = view.defined_by(skip_reshape(view, view.value(masked, 0)), Binary, "scaled scores")
    qk = view.defined_by(sc.inputs[0], MatMul, "q k^T")
    k = view.value(view.defined_by(qk.inputs[1], Transpose, "k^T"), 0)
    return view.literal(sc, 1).value, either(view, view.value(qk, 0)), k, view.value(pv, 1), \
        either(view, view.value(masked, 1))


def either(view: GraphView, v) -> list:
    """A chain operand as the chain may have reshaped it (GQA grouping of q, the mask's
    head axis split like q's) or as it is: the reshaped reading first."""
    return list(dict.fromkeys((skip_reshape(view, v), v)))


def widened(view: GraphView, k, v) -> tuple:
    """(k, v) as the 16-bit values their Cast(F32)s widen (both of one dtype), or NoMatch."""
    srcs = []
    for x in (k, v):
        e = view.producer(x)
        if e is None or not isinstance(e.op, Cast) or e.op.to is not DType.F32:
            raise NoMatch("k and v are not widened by Cast(f32)")
        srcs.append(view.value(e, 0))
    dts = {view.type_of(x).dtype for x in srcs}
    if len(dts) != 1 or not dts <= set(KV_WIDENED):
        raise NoMatch(f"k and v are widened from {sorted(map(str, dts))}, not one of "
                      f"{', '.join(map(str, KV_WIDENED))}")
    return tuple(srcs)


def dequantized(view: GraphView, k, v) -> tuple:
    """((k codes, k scales), (v codes, v scales)) that q8_rows dequantizes k and v from, or
    NoMatch (the definition match then proves each read, eqn for eqn)."""
    out = []
    for x, what in ((k, "k"), (v, "v")):
        mul = view.defined_by(view.value(view.defined_by(x, Reshape, f"{what}'s rows"), 0),
                              Binary, f"{what}: f32(codes) * scales")
        cast = view.defined_by(mul.inputs[0], Cast, f"{what}: f32(codes)")
        codes = view.defined_by(cast.inputs[0], Reshape, f"{what}'s code blocks")
        scales = view.defined_by(mul.inputs[1], Reshape, f"{what}'s scale blocks")
        out.append((view.value(codes, 0), view.value(scales, 0)))
    return tuple(out)


def find(view: GraphView, pv, build, read=None):
    """(op, args, root, chain) for the first reading of the chain at `pv` that is exactly
    `build(scale, q, k, v, mask)`'s definition, with k and v as `read` gives them from the
    chain's (the 16-bit sources of their casts, the q8 codes and scales of their
    dequantization); NoMatch with the last reason otherwise."""
    scale, qs, k, v, masks = parts(view, pv)
    if read is not None:
        k, v = read(view, k, v)
    user = view.single_user(pv.out)
    roots = ([user] if user is not None and isinstance(user.op, Reshape) else []) + [pv]
    why = NoMatch("no reading of the chain matched")
    for q, mask in itertools.product(qs, masks):
        try:
            op, args = build(view, scale, q, k, v, mask)
        except NoMatch as exc:
            why = exc
            continue
        for root in roots:
            try:
                return op, args, root, match_definition(view, op, args, root)
            except NoMatch as exc:
                why = exc
    raise why


def plain(view, scale, q, k, v, mask):
    return Attention(scale), [q, k, v, mask]


def q8(view, scale, q, k, v, mask):
    """Q8KVAttention, k and v each (codes, scales)."""
    return Q8KVAttention(scale), [q, *k, *v, mask]


def sinked(view, scale, q, k, v, mask, sinks):
    return SinkAttention(scale), [q, k, v, mask, sinks]


def q8_sinked(view, scale, q, k, v, mask, sinks):
    """Q8KVSinkAttention, k and v each (codes, scales)."""
    return Q8KVSinkAttention(scale), [q, *k, *v, mask, sinks]


def sinks_of(view: GraphView, pv):
    """The sinks [Hq] of a chain whose max also takes them (SinkAttention's form), or None."""
    try:
        div = view.defined_by(skip_reshape(view, view.value(pv, 0)), Binary, "the softmax")
        ex = view.defined_by(div.inputs[0], Unary, "exp")
        sub = view.defined_by(ex.inputs[0], Binary, "scores - max")
        top = view.defined_by(sub.inputs[1], Binary, "the max with the sinks")
    except NoMatch:
        return None
    return skip_reshape(view, view.value(top, 1)) if top.op.op is BinaryOp.Max else None


def pool_reads(view: GraphView, named) -> tuple[list, object]:
    """(pools, slot map) of values each Transpose(Gather(pool, slot_map), (0, 2, 1, 3)) (a
    paged read) through one slot map; `named` is (value, what) pairs; NoMatch otherwise."""
    pools, maps = [], set()
    for x, what in named:
        tr = view.defined_by(x, Transpose, f"{what} (a transposed paged read)")
        if tr.op.perm != (0, 2, 1, 3):
            raise NoMatch(f"{what} is transposed by {tr.op.perm}, not (0, 2, 1, 3)")
        ga = view.defined_by(view.value(tr, 0), Gather, f"{what}'s paged read")
        if ga.op.axis != 0:
            raise NoMatch(f"{what} is gathered on axis {ga.op.axis}, not 0")
        pools.append(view.value(ga, 0))
        maps.add(view.value(ga, 1))
    if len(maps) != 1:
        raise NoMatch("k and v are read through different slot maps")
    return pools, maps.pop()


def paged(view, scale, q, k, v, mask):
    """PagedAttention when k and v are pool rows gathered through one slot map."""
    (kpool, vpool), smap = pool_reads(view, ((k, "k"), (v, "v")))
    return PagedAttention(scale), [q, kpool, vpool, smap, mask]


def q8_paged(view, scale, q, k, v, mask):
    """PagedQ8KVAttention when k's and v's codes and scales are all pool rows gathered
    through one slot map."""
    pools, smap = pool_reads(view, ((k[0], "k codes"), (k[1], "k scales"),
                                    (v[0], "v codes"), (v[1], "v scales")))
    return PagedQ8KVAttention(scale), [q, *pools, smap, mask]


def candidates(view: GraphView):
    """MatMuls whose left operand is (a reshape of) a Div: the chain's second matmul."""
    for e in view.eqns:
        if isinstance(e.op, MatMul):
            d = view.producer(skip_reshape(view, e.inputs[0].id))
            if d is not None and isinstance(d.op, Binary) and d.op.op is BinaryOp.Div:
                yield e


def key_count(view: GraphView, op, args) -> int:
    """S: the keys each query row attends over (a paged read's slot map width)."""
    if isinstance(op, (PagedAttention, PagedQ8KVAttention)):
        return view.type_of(args[-2]).shape[-1]
    return view.type_of(args[1]).shape[-2]


def over_limit(policy, view: GraphView, q, keys: int) -> str | None:
    dim = view.type_of(q).shape[-1]
    if policy.attention_max_keys is not None and keys > policy.attention_max_keys:
        return f"{keys} keys exceed policy.attention_max_keys={policy.attention_max_keys}"
    if policy.attention_max_head_dim is not None and dim > policy.attention_max_head_dim:
        return f"head dim {dim} exceeds policy.attention_max_head_dim=" \
               f"{policy.attention_max_head_dim}"
    return None


def forms(view: GraphView, pv) -> list[tuple]:
    """(read, build) pairs in the order they are tried: a 16-bit k and v read directly,
    q8_0 ones read directly, then the f32 values as they are; each paged form before the
    dense one."""
    sinks = sinks_of(view, pv)
    if sinks is not None:
        return [(widened, partial(sinked, sinks=sinks)),
                (dequantized, partial(q8_sinked, sinks=sinks)),
                (None, partial(sinked, sinks=sinks))]
    return [(widened, paged), (widened, plain), (dequantized, q8_paged), (dequantized, q8),
            (None, paged), (None, plain)]


def accepted(view: GraphView, ctx, pv):
    """(op, args, root, chain) of the first form the target takes (`forms`); None when none
    fits, with the last form's reason recorded as kept."""
    why = ""
    for read, build in forms(view, pv):
        try:
            op, args, root, chain = find(view, pv, build, read)
        except NoMatch as exc:
            why = str(exc)
            continue
        keys = key_count(view, op, args)
        why = ("policy.attention is 'never'" if ctx.policy.attention == "never" else
               over_limit(ctx.policy, view, args[0], keys))
        if why is None:
            target = ctx.refusal(op, args, root, view)
            if target is None:
                return op, args, root, chain
            why = f"target refuses: {target}"
    ctx.record.kept("Attention", pv.out, why)
    return None


def run(graph, ctx):
    view, rw = GraphView(graph), Rewriter(graph)
    for pv in candidates(view):
        found = accepted(view, ctx, pv)
        if found is None:
            continue
        op, args, root, chain = found
        if rw.claimed(c.out for c in chain):
            continue
        rw.replace(root, op, args, chain)
        q = view.type_of(args[0]).shape
        paged_op = isinstance(op, (PagedAttention, PagedQ8KVAttention))
        hkv = view.type_of(args[1]).shape[-2 if paged_op else -3]
        ctx.record.rewrote("Attention", root.out, f"{len(chain)} eqns -> {op.name} "
                           f"(T={q[-2]}, S={key_count(view, op, args)}, Hq={q[-3]}, "
                           f"Hkv={hkv})")
    return rw.commit()
