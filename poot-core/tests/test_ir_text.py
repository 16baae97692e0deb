"""The text form: the spec's decode-step attention layer prints as its primitive eqns, and
`parse(str(g))` reproduces an equal graph for a spread of graphs (slots, state, witnesses,
exports, Computed values, region bodies, packed weights, literals, edited graphs)."""
from __future__ import annotations

import math

import numpy as np
import poot
import poot.ops as P
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from poot.dtypes import DType
from poot.errors import DtypeError, ParseError, ShapeError
from poot.formats import PackedWeight
from poot.ir import Builder, Lit, SlotKind, TensorType, Value, WeightRef, region
from poot.ir import ops as O
from poot.ir.parse import graphs_equal, parse

F32, I32, U32, BF16 = DType.F32, DType.I32, DType.U32, DType.BF16
ADD, MUL = O.Binary(O.BinaryOp.Add), O.Binary(O.BinaryOp.Mul)


def T(shape, dtype=F32):
    return TensorType(tuple(shape), dtype)


def round_trip(g):
    text = str(g)
    g2 = parse(text)
    assert graphs_equal(g, g2), f"{text}\n!=\n{g2}"
    assert str(g2) == text
    return g2


def decode_attention_layer(h=4, cap=6, d=8):
    """The spec's decode-step attention layer: q [H,D], k_cache/v_cache [H,cap,D], the
    causal mask [cap] from Pos and an Iota, then MatMul, Mul 1/sqrt(D), Add mask, Reduce Max,
    Sub, Exp, Reduce Sum, Div, MatMul."""
    def layer(q, k_cache, v_cache, pos):
        mask = P.reshape(P.causal_mask(pos, 1, cap), (cap,))
        scores = P.matmul(P.reshape(q, (h, 1, d)), P.swap_last(k_cache))       # [H,1,cap]
        scores = P.add(P.mul(P.reshape(scores, (h, cap)), 1 / math.sqrt(d)), mask)
        m = P.reduce_max(scores, -1, keepdim=True)
        e = P.exp(P.sub(scores, m))
        p = P.div(e, P.reduce_sum(e, -1, keepdim=True))
        return P.reshape(P.matmul(P.reshape(p, (h, 1, cap)), v_cache), (h, d))
    return poot.trace(layer, poot.spec((h, d), name="q"),
                      poot.spec((h, cap, d), name="k_cache"),
                      poot.spec((h, cap, d), name="v_cache"),
                      poot.spec((1,), "i32", name="pos", kind="slot", slot="Pos", bound=cap))


def test_decode_attention_layer_prints_as_its_primitive_eqns(rand):
    h, cap, d = 4, 6, 8
    g = decode_attention_layer(h, cap, d)
    text = str(g)
    lines = text.splitlines()
    assert lines[0] == "layer("
    assert lines[1:5] == ["  %0: f32[4,8] = const 'q'", "  %1: f32[4,6,8] = const 'k_cache'",
                          "  %2: f32[4,6,8] = const 'v_cache'",
                          "  %3: i32[1] = slot Pos 'pos' in [0, 6)"]
    body = [ln.split(" = ", 1)[1] for ln in lines[6:-1]]
    heads = [b.split(" ")[0].split("{")[0] for b in body]
    mask_part = heads[:heads.index("Select") + 1]
    assert "Iota" in mask_part and "Ge" in mask_part
    attn = [x for x in heads[len(mask_part):] if x not in ("Reshape", "Transpose")]
    assert attn == ["MatMul", "Mul", "Add", "Reduce", "Sub", "Exp", "Reduce", "Div", "MatMul"]
    assert "Mul %" in text and f"{1 / math.sqrt(d)!r}:f32" in text
    assert "Reduce{op=Max, axis=-1, keepdim=True}" in text
    assert "Reduce{op=Sum, axis=-1, keepdim=True}" in text
    assert lines[-1].startswith("} -> result %")
    assert not any(ln != ln.rstrip() for ln in lines)
    round_trip(g)
    q, k, v = rand((h, d)), rand((h, cap, d)), rand((h, cap, d))
    (out,) = poot.evaluate(g, [q, k, v, np.array([3], np.int32)])
    s = np.einsum("hd,hcd->hc", q.astype(np.float64), k) / math.sqrt(d)
    s[:, 4:] = -np.inf
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    np.testing.assert_allclose(out, np.einsum("hc,hcd->hd", p, v), rtol=2e-5, atol=2e-6)


def everything_graph():
    """Every binder kind and output kind, regions, a packed weight with attrs, odd names."""
    role = SlotKind.declare("TextTestExpertMap", I32, 0, 4, owner="tests")
    b = Builder("everything ()", compiler=True)
    x = b.const(T((2, 4)), "x 'quoted'")
    w = b.const(T((6, 2), U32), WeightRef("m.gguf", "blk.0.w", payload="sha:ab", format="f16"))
    pos = b.slot(SlotKind.POS, (1,), "pos", bound=8)
    wm = b.slot(SlotKind.WRITE_MAP, (1,), "wm", bound=8)
    sm = b.slot(SlotKind.SLOT_MAP, (3,), "sm")
    em = b.slot(role, (2,), "experts", bound=3)
    cache = b.state(T((8, 4)), "cache")
    io = b.computed(O.Iota((2, 4), 1, F32), "iota")
    anon = b.computed(O.Iota((4,), 0, I32))
    fused = O.Fused(region([T((2, 4)), T((2, 4))], lambda r, a, c: r.eqn(
        O.Unary(O.UnaryOp.Tanh), r.eqn(ADD, a, r.eqn(MUL, c, Lit(float("-inf"), F32))))))
    h = b.name_value(b.eqn(fused, x, io), " h  # not a comment")
    pw = PackedWeight("dense:f16words", (6, 4), {"note": "a, b", "group": 32})
    head = O.PackedContraction(pw)
    epi = O.ContractionEpilogue(head, 2, region(
        [T((2, 6)), T((6,))], lambda r, y, bias: r.eqn(ADD, y, bias)))
    bias = b.const(T((6,)), "bias")
    y = b.eqn(epi, h, w, bias)
    row = b.eqn(O.FusedRow(region([T((2, 6))], lambda r, a: r.eqn(
        O.Reduce(O.ReduceOp.Max, -1, True), a)), -1), y)
    g1 = b.eqn(O.Gather(0), b.eqn(O.Cast(I32), b.eqn(O.Slice(0, 0, 1), row)), sm)
    nxt = b.eqn(O.ScatterUpdate(), cache, b.eqn(O.Slice(0, 0, 1), h), wm)
    nxt = b.eqn(O.DynamicUpdateSlice(0), nxt, b.eqn(O.Slice(0, 1, 2), h), pos)
    b.witness(y, "after 'epilogue'; ok")
    b.export(row, "stage one")
    b.export(h, "s2")
    b.state_next(cache, nxt)
    tail = b.eqn(ADD, b.eqn(O.Select(), b.eqn(O.Binary(O.BinaryOp.Ge), em, Lit(1, I32)),
                            b.eqn(O.Broadcast((2,)),
                                  b.eqn(O.Reshape(()), b.eqn(O.Slice(0, 0, 1), g1))),
                            Lit(-7, I32)),
                 b.eqn(O.Slice(0, 0, 2), anon))
    b.result(b.eqn(O.Binary(O.BinaryOp.Shr), tail, Lit(2 ** 31 - 1, I32)))
    return b.finish()


def test_round_trip_of_every_binder_output_and_region():
    g = everything_graph()
    text = str(g)
    assert "payload 'sha:ab' format 'f16'" in text
    assert "slot TextTestExpertMap 'experts' in [0, 4) bound 3" in text
    assert "export %" in text and "@'stage one'" in text and "@s2" in text
    assert "note='a, b'" in text and "-inf:f32" in text
    assert "# ' h  # not a comment'" in text
    g2 = round_trip(g)
    assert g2.meta(g.inputs()[5]).storage.slot.bound == 3
    for (e1, e2) in zip(g.eqns(), g2.eqns(), strict=True):
        if isinstance(e1.op, O.ContractionEpilogue):
            assert e2.op.n_head == 2 and e2.op.head.weight == e1.op.head.weight


def test_round_trip_of_traced_models():
    def block(x, w, wq, cos, sin, kc, pos):
        h = P.rms_norm(x, w, 1e-5)
        q = P.rope_partial(P.reshape(P.linear(h, wq), (1, 2, 8)), cos, sin, pos, 2)
        P.witness(q, "q")
        nk = P.kv_write_dense(kc, q, pos)
        P.state_update(kc, nk)
        return P.attention_masked(q, nk, nk, P.causal_mask(pos, 2, 6, window=3))
    g = poot.trace(block, poot.spec((2, 8), name="x"), poot.spec((8,), name="w"),
                   poot.spec((8, 8), "bf16", name="wq"), poot.spec((6, 1), name="cos"),
                   poot.spec((6, 1), name="sin"),
                   poot.spec((1, 6, 8), name="kc", kind="state"),
                   poot.spec((1,), "i32", name="pos", kind="slot", slot="Pos", bound=5))
    round_trip(g)
    g = poot.trace(lambda h0, xs: P.scan(lambda c, x: P.mul(P.add(c, x), 0.5), h0, [xs], 3),
                   poot.spec((4,), name="h0"), poot.spec((3, 4), name="xs"))
    g2 = round_trip(g)
    assert isinstance(g2.eqns()[0].op, O.Scan) and g2.eqns()[0].op.length == 3


def test_round_trip_of_compiled_graphs(rand):
    """What compile makes (Rope, Attention, Fused/FusedRow regions, contractions) reads back."""
    def block(x, w, wq, cos, sin, kc, pos):
        h = P.rms_norm(x, w, 1e-5)
        q = P.rope_partial(P.reshape(P.linear(h, wq), (1, 2, 8)), cos, sin, pos, 2)
        nk = P.kv_write_dense(kc, q, pos)
        P.state_update(kc, nk)
        return P.swiglu(P.attention_masked(q, nk, nk, P.causal_mask(pos, 2, 6, window=3)), q)
    g = poot.trace(block, poot.spec((2, 8), name="x"), poot.spec((8,), name="w"),
                   poot.spec((8, 8), "bf16", name="wq"), poot.spec((6, 1), name="cos"),
                   poot.spec((6, 1), name="sin"), poot.spec((1, 6, 8), name="kc", kind="state"),
                   poot.spec((1,), "i32", name="pos", kind="slot", slot="Pos", bound=5))
    for graph in (g, decode_attention_layer()):
        cg = poot.compile(graph).graph
        assert any(e.op.compiler_only for e in cg.eqns())
        cg2 = round_trip(cg)
        ins = [rand(cg.type_of(v).shape, cg.type_of(v).dtype) if cg.type_of(v).dtype.is_float
               else np.array([1], np.int32) for v in cg.inputs()
               if cg.meta(v).storage.cls.value != "Computed"]
        for x, y in zip(poot.evaluate(cg, ins), poot.evaluate(cg2, ins), strict=True):
            np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize("op,ins", [
    (O.Unary(O.UnaryOp.Clz), [T((3,), I32)]), (O.Binary(O.BinaryOp.GeU), [T((3,), U32)] * 2),
    (O.Cast(DType.F8E4M3), [T((3,))]), (O.Transpose((1, 0)), [T((2, 3))]),
    (O.Concat(-1), [T((2, 3)), T((2, 1))]), (O.ArgTopK(2), [T((2, 3))]),
    (O.MatMul(), [T((1, 2, 3), BF16), T((3, 4), BF16)]),
    (O.IndexedMatMul(), [T((2, 3)), T((4, 3, 5)), T((2,), I32)]),
    (O.PackedDequant(PackedWeight("dense:f16words", (2, 4))), [T((2, 2), U32)]),
    (O.Attention(0.125), [T((2, 1, 4)), T((1, 3, 4)), T((1, 3, 4)), T((1, 3))]),
    (O.Rope(2), [T((2, 4)), T((2, 1)), T((2, 1))]), (O.BlockTopK(2, 1), [T((1, 2, 4))] * 2),
    (O.SelectedAttention(2, 0.5), [T((1, 2, 4)), T((1, 4, 4)), T((1, 4, 4)), T((1, 2, 1), I32),
                                   T((2, 4))]),
    (O.PackedRowGather(PackedWeight("dense:f16words", (5, 4))), [T((3,), I32),
                                                                 T((5, 2), U32)]),
    (O.IndexedPackedContraction(PackedWeight("dense:f16words", (6, 4)), 3),
     [T((2, 4)), T((2,), I32), T((6, 2), U32)]),
    (O.DenseContraction(), [T((2, 4)), T((3, 2), U32)]),
    (O.DenseRowGather(), [T((5, 4), BF16), T((2,), I32)]),
    (O.GroupedDenseContraction(2), [T((2, 1, 4)), T((6, 4), BF16)]),
    (O.AllReduce(2), [T((3,))]), (O.AllGather(4, -1), [T((2, 3))]),
], ids=lambda x: x.name if hasattr(x, "name") else "")
def test_round_trip_of_each_op(op, ins):
    b = Builder(f"one {op.name}", compiler=True)
    refs = [b.const(t, f"in{i}") for i, t in enumerate(ins)]
    b.result(b.eqn(op, *refs))
    round_trip(b.finish())


def test_round_trip_of_an_edited_graph_with_holes_in_the_table(rand):
    g = decode_attention_layer()
    d = g.edit()
    dead = d.new_value(T((3,)))  # a row nothing uses
    e = d.new_eqn(O.Unary(O.UnaryOp.Neg), [Value(g.result())])
    e2 = d.new_eqn(O.Unary(O.UnaryOp.Neg), [Value(e.out)])
    d.eqns += [e, e2]
    d.replace_uses(g.result(), e2.out)
    d.eqns[-2] = type(e)(e.op, (Value(g.result()),), e.out)
    g2 = d.commit()
    assert dead.index < e.out.index
    g3 = round_trip(g2)
    ins = [rand((4, 8)), rand((4, 6, 8)), rand((4, 6, 8)), np.array([2], np.int32)]
    np.testing.assert_array_equal(poot.evaluate(g3, ins)[0], poot.evaluate(g, ins)[0])


def test_graphs_equal_sees_differences():
    g = decode_attention_layer()
    assert not graphs_equal(g, decode_attention_layer(cap=7))
    text = str(g)
    assert not graphs_equal(g, parse(text.replace("'q'", "'q2'")))
    assert not graphs_equal(g, parse(text.replace("Exp %", "Tanh %", 1)))
    assert not graphs_equal(g, parse(text.replace("layer(", "other(", 1)))


@pytest.mark.parametrize("mutate,match", [
    (lambda t: t.replace(") {", ") [", 1), "unexpected end of text|bad binder"),
    (lambda t: t.replace("MatMul %", "MatMool %", 1), "unknown op 'MatMool'"),
    (lambda t: t.replace("f32[4,8] = const", "f64[4,8] = const", 1), "unknown dtype 'f64'"),
    (lambda t: t.replace("slot Pos", "slot Posx", 1), "unknown slot kind 'Posx'"),
    (lambda t: t.replace("} -> result", "} -> resultant", 1), "bad outputs"),
    (lambda t: t.replace("Reduce{op=Max", "Reduce{opp=Max", 1), "Reduce has no parameter"),
    (lambda t: t + "\nextra", "text after the graph"),
    (lambda t: t.replace("Exp %", "Exp %99", 1), "not well formed"),
])
def test_parse_errors_name_the_line(mutate, match):
    text = mutate(str(decode_attention_layer()))
    with pytest.raises(ParseError, match=match) as err:
        parse(text)
    assert "line " in str(err.value) or "not well formed" in str(err.value)


# -- random graphs ---------------------------------------------------------------------------
_PALETTE = [
    lambda d, s: O.Unary(d.draw(st.sampled_from([O.UnaryOp.Neg, O.UnaryOp.Exp, O.UnaryOp.Tanh]))),
    lambda d, s: O.Binary(d.draw(st.sampled_from([O.BinaryOp.Add, O.BinaryOp.Mul,
                                                  O.BinaryOp.Max, O.BinaryOp.Sub]))),
    lambda d, s: O.Reduce(d.draw(st.sampled_from(list(O.ReduceOp))),
                          d.draw(st.integers(-2, 1)), d.draw(st.booleans())),
    lambda d, s: O.Transpose(tuple(d.draw(st.permutations(range(len(s)))))),
    lambda d, s: O.Reshape((max(1, math.prod(s)),)) if math.prod(s) else O.Reshape(s),
    lambda d, s: O.Slice(-1, 0, d.draw(st.integers(0, s[-1] if s else 0))),
    lambda d, s: O.Concat(d.draw(st.integers(-1, 0))),
    lambda d, s: O.Cast(d.draw(st.sampled_from([BF16, DType.F16, F32]))),
    lambda d, s: O.Broadcast((2,) + tuple(s)),
]


@settings(max_examples=25, deadline=None)
@given(st.data())
def test_random_graphs_round_trip_and_evaluate_the_same(data):
    b = Builder("random")
    vals = [b.const(T((2, 3)), "a"), b.const(T((3,)), "b"), b.param(T((1, 3)), "p")]
    for _ in range(data.draw(st.integers(1, 8))):
        x = data.draw(st.sampled_from(vals))
        op = data.draw(st.sampled_from(_PALETTE))(data, x.shape)
        arity = {"Binary": 2, "Concat": 2}.get(op.name, 1)
        args = [x] + [data.draw(st.sampled_from(vals)) for _ in range(arity - 1)]
        if isinstance(op, O.Binary) and args[1].dtype != x.dtype:
            args[1] = b.eqn(O.Cast(x.dtype), args[1])
        try:
            vals.append(b.eqn(op, *args))
        except (ShapeError, DtypeError):
            continue
        if data.draw(st.booleans()):
            b.name_value(vals[-1], f"v{len(vals)}")
    b.result(vals[-1])
    if len(vals) > 4:
        b.witness(vals[3], "w")
    g = b.finish()
    g2 = round_trip(g)
    rng = np.random.default_rng(len(g.eqns()))
    ins = [rng.standard_normal(g.type_of(v).shape).astype(np.float32) for v in g.inputs()]
    for x, y in zip(poot.evaluate(g, ins), poot.evaluate(g2, ins), strict=True):
        np.testing.assert_array_equal(np.ascontiguousarray(x).reshape(-1).view(np.uint8),
                                      np.ascontiguousarray(y).reshape(-1).view(np.uint8))
