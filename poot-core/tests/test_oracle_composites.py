"""Every composite, evaluated by the oracle through its primitive definition (`define`),
against numpy written here; each definition is made of primitives only and has the type its
composite's `infer` states."""
from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import poot
import poot.ops
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from poot.dtypes import DType
from poot.errors import DtypeError, ShapeError, UnsupportedOp
from poot.formats import PackedWeight
from poot.ir import Builder, Lit, TensorType, region
from poot.ir import ops as O
from poot.oracle import apply, definition

F32, F16, BF16, I32, U32 = DType.F32, DType.F16, DType.BF16, DType.I32, DType.U32
ADD, MUL = O.Binary(O.BinaryOp.Add), O.Binary(O.BinaryOp.Mul)


def T(shape, dtype=F32):
    return TensorType(tuple(shape), dtype)


def ev(op, *arrays):
    """Evaluate one composite eqn on arrays; also check its definition's shape and type."""
    arrays = [np.asarray(a) for a in arrays]
    types = [T(a.shape, DType.of(a)) for a in arrays]
    d = definition(op, types)
    assert d.type_of(d.result()) == op.infer(types)
    assert all(not e.op.compiler_only for e in d.eqns())  # primitives only
    b = Builder(op.name, compiler=True)
    refs = [b.const(t, f"a{i}") for i, t in enumerate(types)]
    b.result(b.eqn(op, *refs))
    (out,) = poot.evaluate(b.finish(), arrays)
    assert out.dtype == op.infer(types).dtype.numpy and out.shape == op.infer(types).shape
    np.testing.assert_array_equal(apply(op, arrays, types, op.infer(types)), out)
    return out


def softmax64(s):
    s = s - s.max(-1, keepdims=True)
    e = np.exp(s)
    return e / e.sum(-1, keepdims=True)


def attention64(q, k, v, mask, scale):
    """softmax(q k^T scale + mask) v with query head h reading kv head h // (Hq/Hkv)."""
    q, k, v = (x.astype(np.float64) for x in (q, k, v))
    g = q.shape[-3] // k.shape[-3]
    k, v = np.repeat(k, g, axis=-3), np.repeat(v, g, axis=-3)
    return softmax64(q @ np.swapaxes(k, -1, -2) * scale + mask) @ v


def causal64(pos, t, s, window=None):
    i = np.arange(t)[:, None] + pos
    j = np.arange(s)[None, :]
    ok = j <= i
    if window is not None:
        ok &= j > i - window
    return np.where(ok, 0.0, -np.inf).astype(np.float32)


# -- regions ------------------------------------------------------------------------------
def test_fused_pointwise_region(rand):
    body = region([T((3, 4)), T((4,))], lambda b, x, y: b.eqn(
        O.Unary(O.UnaryOp.Tanh), b.eqn(ADD, b.eqn(MUL, x, y), Lit(0.5, F32))))
    x, y = rand((3, 4)), rand((4,))
    got = ev(O.Fused(body), x, y)
    np.testing.assert_allclose(got, np.tanh(x.astype(np.float64) * y + 0.5), rtol=1e-6,
                               atol=1e-6)
    with pytest.raises(ShapeError, match=r"^Fused: region takes \[f32\[3,4\], f32\[4\]\]"):
        O.Fused(body).infer([T((3, 4)), T((3,))])


def test_fused_row_region_rms_norm(rand):
    def rms(b, x, w):
        ss = b.eqn(O.Reduce(O.ReduceOp.Sum, -1, True), b.eqn(MUL, x, x))
        den = b.eqn(O.Unary(O.UnaryOp.Sqrt), b.eqn(ADD, b.eqn(MUL, ss, Lit(1 / 8, F32)),
                                                  Lit(1e-5, F32)))
        return b.eqn(MUL, b.eqn(O.Binary(O.BinaryOp.Div), x, den), w)
    body = region([T((5, 8)), T((8,))], rms)
    x, w = rand((5, 8)), rand((8,))
    got = ev(O.FusedRow(body, -1), x, w)
    x64 = x.astype(np.float64)
    want = x64 / np.sqrt((x64 ** 2).mean(-1, keepdims=True) + 1e-5) * w
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_contraction_epilogue_f32(rand):
    body = region([T((3, 5)), T((5,)), T((3, 5))], lambda b, h, bias, res: b.eqn(
        ADD, b.eqn(ADD, h, bias), res))
    a, w, bias, res = rand((3, 4)), rand((4, 5)), rand((5,)), rand((3, 5))
    op = O.ContractionEpilogue(O.MatMul(), 2, body)
    got = ev(op, a, w, bias, res)
    np.testing.assert_allclose(got, a.astype(np.float64) @ w + bias + res, rtol=1e-5, atol=1e-6)
    with pytest.raises(ShapeError, match="^ContractionEpilogue: epilogue takes"):
        op.infer([T((3, 4)), T((4, 6)), T((5,)), T((3, 5))])


def test_contraction_epilogue_bf16_rounds_the_head_first(rand):
    body = region([T((2, 3), BF16), T((3,), BF16)], lambda b, h, s: b.eqn(MUL, h, s))
    a, w, s = rand((2, 16), BF16), rand((16, 3), BF16), rand((3,), BF16)
    got = ev(O.ContractionEpilogue(O.MatMul(), 2, body), a, w, s)
    head = (a.astype(np.float32) @ w.astype(np.float32)).astype(ml_dtypes.bfloat16)
    want = (head.astype(np.float32) * s.astype(np.float32)).astype(ml_dtypes.bfloat16)
    np.testing.assert_array_equal(got, want)


def test_contraction_epilogue_with_a_dense_contraction_head(rand):
    n, k = 5, 8
    w16 = rand((n, k), F16)
    words = np.frombuffer(w16.astype("<f2").tobytes(), "<u4").reshape(n, k // 2).copy()
    body = region([T((3, n)), T((n,))], lambda b, h, bias: b.eqn(
        O.Unary(O.UnaryOp.Tanh), b.eqn(ADD, h, bias)))
    op = O.ContractionEpilogue(O.DenseContraction(), 2, body)
    a, bias = rand((3, k)), rand((n,))
    types = [T(a.shape), T(words.shape, U32), T(bias.shape)]
    assert op.infer(types) == T((3, n))
    b = Builder("epi", compiler=True)
    refs = [b.const(t, f"a{i}") for i, t in enumerate(types)]
    b.result(b.eqn(op, *refs))
    (got,) = poot.evaluate(b.finish(), [a, words, bias])
    want = np.tanh(a.astype(np.float64) @ w16.astype(np.float64).T + bias)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


# -- attention ------------------------------------------------------------------------------
@pytest.mark.parametrize("hq,hkv,t,s,window", [(4, 4, 1, 7, None), (4, 2, 3, 9, None),
                                               (6, 2, 4, 12, 5), (3, 1, 2, 5, 2)])
def test_attention_causal_sliding_gqa(hq, hkv, t, s, window, rand, rng):
    d = 8
    q, k, v = rand((hq, t, d)), rand((hkv, s, d)), rand((hkv, s, 6))
    pos = int(rng.integers(0, s - t + 1))
    mask = causal64(pos, t, s, window)
    scale = 1 / math.sqrt(d)
    got = ev(O.Attention(scale), q, k, v, mask)
    np.testing.assert_allclose(got, attention64(q, k, v, mask, scale), rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize("mask_shape", [(1, 1, 3, 5), (2, 1, 3, 5), (2, 4, 3, 5), (4, 3, 5),
                                        (1, 3, 5), (3, 5), (5,)])
def test_attention_batched_masks(mask_shape, rand, rng):
    b, hq, hkv, t, s, d = 2, 4, 2, 3, 5, 4
    q, k, v = rand((b, hq, t, d)), rand((b, hkv, s, d)), rand((b, hkv, s, d))
    mask = np.where(rng.random(mask_shape) < 0.4, -np.inf, 0).astype(np.float32)
    mask[..., 0] = 0  # every query sees key 0
    got = ev(O.Attention(0.7), q, k, v, mask)
    np.testing.assert_allclose(got, attention64(q, k, v, mask, 0.7), rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize("kv", [F16, BF16])
def test_attention_reads_16_bit_keys_as_their_f32_widening(kv, rand, rng):
    """An f32 query over f16 or bf16 k and v (an f16 KV cache read in place) is the f32
    attention over the widened keys, paged and with sinks too."""
    q, k, v = rand((4, 3, 8)), rand((2, 7, 8)).astype(kv.numpy), rand((2, 7, 8)).astype(kv.numpy)
    mask = causal64(3, 3, 7, None)
    k32, v32 = k.astype(np.float32), v.astype(np.float32)
    np.testing.assert_array_equal(ev(O.Attention(0.5), q, k, v, mask),
                                  ev(O.Attention(0.5), q, k32, v32, mask))
    sinks = rand((4,))
    np.testing.assert_array_equal(ev(O.SinkAttention(0.5), q, k, v, mask, sinks),
                                  ev(O.SinkAttention(0.5), q, k32, v32, mask, sinks))
    pool, smap = rand((9, 2, 8)).astype(kv.numpy), rng.integers(0, 9, (2, 7)).astype(np.int32)
    qp, mp = rand((2, 4, 1, 8)), np.zeros((2, 1, 1, 1, 7), np.float32)
    np.testing.assert_array_equal(ev(O.PagedAttention(0.5), qp, pool, pool, smap, mp),
                                  ev(O.PagedAttention(0.5), qp, *[pool.astype(np.float32)] * 2,
                                     smap, mp))


def test_q8_kv_attention_is_the_f32_attention_over_its_dequantized_rows(rand, rng):
    """Q8KVAttention over q8_0 codes and scales (a q8_0 KV cache read in place) is Attention
    over f32(code) * scale, bit for bit, and PagedQ8KVAttention is it over the pools' rows
    gathered through the slot map; the operands are checked by name."""
    q, mask = rand((4, 3, 64)), causal64(3, 3, 7, None)
    codes = [rng.integers(-127, 128, (2, 7, 64)).astype(np.int8) for _ in range(2)]
    scales = [(rng.random((2, 7, 2)) * 0.05).astype(np.float32) for _ in range(2)]
    rows = [(c.astype(np.float32).reshape(2, 7, 2, 32) * d[..., None]).reshape(2, 7, 64)
            for c, d in zip(codes, scales, strict=True)]
    np.testing.assert_array_equal(
        ev(O.Q8KVAttention(0.5), q, codes[0], scales[0], codes[1], scales[1], mask),
        ev(O.Attention(0.5), q, *rows, mask))
    pools = [rng.integers(-127, 128, (9, 2, 64)).astype(np.int8),
             (rng.random((9, 2, 2)) * 0.05).astype(np.float32)]
    smap, qp, mp = rng.integers(0, 9, (2, 7)).astype(np.int32), rand((2, 4, 1, 64)), \
        np.zeros((2, 1, 1, 1, 7), np.float32)
    gathered = [np.ascontiguousarray(x[smap].transpose(0, 2, 1, 3)) for x in pools]
    np.testing.assert_array_equal(
        ev(O.PagedQ8KVAttention(0.5), qp, *pools, *pools, smap, mp),
        ev(O.Q8KVAttention(0.5), qp, *gathered, *gathered, mp))
    op, c, d = O.Q8KVAttention(0.5), T((2, 7, 64), DType.I8), T((2, 7, 2))
    with pytest.raises(ShapeError, match=r"k's scales must be \(2, 7, 2\)"):
        op.infer([T((4, 3, 64)), c, T((2, 7, 1)), c, d, T((3, 7))])
    with pytest.raises(DtypeError, match="v codes dtype f16"):
        op.infer([T((4, 3, 64)), c, d, T((2, 7, 64), F16), d, T((3, 7))])
    with pytest.raises(DtypeError, match="q dtype f16"):
        op.infer([T((4, 3, 64), F16), c, d, c, d, T((3, 7), F16)])
    with pytest.raises(ShapeError, match="not a multiple of the quantization block"):
        op.infer([T((4, 3, 40)), T((2, 7, 40), DType.I8), d, c, d, T((3, 7))])


def test_q8_kv_sink_attention_is_sink_attention_over_its_dequantized_rows(rand, rng):
    """Q8KVSinkAttention (gpt-oss over a q8_0 cache) is SinkAttention over f32(code) *
    scale, bit for bit; its sinks are checked as SinkAttention's."""
    q, mask, sinks = rand((4, 3, 64)), causal64(3, 3, 7, None), rand((4,))
    codes = [rng.integers(-127, 128, (2, 7, 64)).astype(np.int8) for _ in range(2)]
    scales = [(rng.random((2, 7, 2)) * 0.05).astype(np.float32) for _ in range(2)]
    rows = [(c.astype(np.float32).reshape(2, 7, 2, 32) * d[..., None]).reshape(2, 7, 64)
            for c, d in zip(codes, scales, strict=True)]
    got = ev(O.Q8KVSinkAttention(0.5), q, codes[0], scales[0], codes[1], scales[1], mask,
             sinks)
    np.testing.assert_array_equal(got, ev(O.SinkAttention(0.5), q, *rows, mask, sinks))
    assert not np.allclose(got, ev(O.Attention(0.5), q, *rows, mask))
    c, d = T((2, 7, 64), DType.I8), T((2, 7, 2))
    with pytest.raises(ShapeError, match=r"sinks must be \[Hq=4\]"):
        O.Q8KVSinkAttention(0.5).infer([T((4, 3, 64)), c, d, c, d, T((3, 7)), T((2,))])


def test_attention_refusals():
    a = O.Attention(1.0)
    why = "^Attention: k and v must share one dtype, q's or"
    with pytest.raises(DtypeError, match=why):    # k and v of different dtypes
        a.infer([T((2, 1, 4)), T((2, 3, 4), BF16), T((2, 3, 4)), T((1, 3))])
    with pytest.raises(DtypeError, match=why):    # only an f32 query reads widened keys
        a.infer([T((2, 1, 4), F16), T((2, 3, 4)), T((2, 3, 4)), T((1, 3), F16)])
    with pytest.raises(DtypeError, match=why):
        a.infer([T((2, 1, 4)), T((2, 3, 4), I32), T((2, 3, 4), I32), T((1, 3))])
    with pytest.raises(DtypeError, match="SelectedAttention: q, k, v must share one float"):
        O.SelectedAttention(2, 1.0).infer([T((2, 1, 4)), T((2, 4, 4), F16), T((2, 4, 4), F16),
                                           T((2, 1, 1), I32), T((1, 4))])
    with pytest.raises(ShapeError, match="Hq a multiple of Hkv"):
        a.infer([T((3, 1, 4)), T((2, 3, 4)), T((2, 3, 4)), T((1, 3))])
    with pytest.raises(ShapeError, match=r"mask must broadcast to \[T=1, S=3\]"):
        a.infer([T((2, 1, 4)), T((2, 3, 4)), T((2, 3, 4)), T((1, 4))])
    with pytest.raises(ShapeError, match="mask must broadcast to q's"):
        a.infer([T((2, 4, 1, 4)), T((2, 2, 3, 4)), T((2, 2, 3, 4)), T((3, 1, 1, 3))])


def test_rope(rand, rng):
    t, d, rot = 5, 10, 6
    x = rand((2, t, d))
    ang = rng.uniform(0, 6, (t, rot // 2))
    cos, sin = np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)
    got = ev(O.Rope(rot), x, cos, sin)
    x64 = x.astype(np.float64)
    x1, x2 = x64[..., : rot // 2], x64[..., rot // 2: rot]
    want = np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin, x64[..., rot:]], -1)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    full = ev(O.Rope(d), x, *(np.ones((t, d // 2), np.float32) * c for c in (1, 0)))
    np.testing.assert_array_equal(full, x)  # angle 0 is the identity
    with pytest.raises(ShapeError, match="^Rope: rot=3 must be even"):
        O.Rope(3).infer([T((2, d)), T((2, 1)), T((2, 1))])


def test_block_topk(rand):
    h, t, s, d, blk, k = 2, 3, 12, 4, 3, 2
    q, key = rand((h, t, d)), rand((h, s, d))
    got = ev(O.BlockTopK(blk, k), q, key)
    pooled = key.astype(np.float64).reshape(h, s // blk, blk, d).sum(2)
    scores = np.einsum("htd,hbd->htb", q.astype(np.float64), pooled)
    want = np.argsort(-scores, axis=-1, kind="stable")[..., :k]
    np.testing.assert_array_equal(got, want)
    with pytest.raises(ShapeError, match="^BlockTopK: S must be a multiple of block=5"):
        O.BlockTopK(5, 1).infer([T((h, t, d)), T((h, s, d))])


def test_selected_attention(rand, rng):
    h, t, s, d, blk, kb = 2, 3, 12, 4, 3, 2
    q, k, v = rand((h, t, d)), rand((h, s, d)), rand((h, s, d))
    blocks = np.stack([np.stack([rng.choice(s // blk, kb, replace=False) for _ in range(t)])
                       for _ in range(h)]).astype(np.int32)
    mask = causal64(s - t, t, s)
    got = ev(O.SelectedAttention(blk, 0.5), q, k, v, blocks, mask)
    keep = np.zeros((h, t, s), bool)
    for hh in range(h):
        for tt in range(t):
            for bb in blocks[hh, tt]:
                keep[hh, tt, bb * blk:(bb + 1) * blk] = True
    full = np.where(keep, mask, -np.inf)
    want = np.stack([attention64(q[hh:hh + 1], k[hh:hh + 1], v[hh:hh + 1], full[hh], 0.5)[0]
                     for hh in range(h)])
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-6)


# -- contractions -------------------------------------------------------------------------------
def f16_words(w16: np.ndarray) -> np.ndarray:
    n, k = w16.shape
    return np.frombuffer(w16.astype("<f2").tobytes(), "<u4").reshape(n, k // 2).copy()


@pytest.mark.parametrize("wdtype", [F32, BF16, F16, U32], ids=str)
def test_dense_contraction_checkpoint_order(wdtype, rand):
    n, k = 5, 8
    a = rand((2, 3, k))
    w = rand((n, k), F16 if wdtype is U32 else wdtype)
    wsrc = f16_words(w) if wdtype is U32 else w
    got = ev(O.DenseContraction(), a, wsrc)
    want = a.astype(np.float64) @ w.astype(np.float64).T
    assert got.shape == (2, 3, n) and got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    with pytest.raises(DtypeError, match="^DenseContraction: weight dtype i32"):
        O.DenseContraction().infer([T((3, k)), T((n, k), I32)])


def test_dense_row_gather_and_grouped_contraction(rand, rng):
    table = rand((10, 6), BF16)
    ids = rng.integers(0, 10, (2, 3)).astype(np.int32)
    got = ev(O.DenseRowGather(), table, ids)
    np.testing.assert_array_equal(got, table.astype(np.float32)[ids])
    with pytest.raises(DtypeError, match="^DenseRowGather: table dtype f32"):
        O.DenseRowGather().infer([T((10, 6)), T((2,), I32)])
    g, m, k, n = 3, 2, 5, 4
    a, w = rand((g, m, k)), rand((g * n, k), BF16)
    got = ev(O.GroupedDenseContraction(g), a, w)
    w64 = w.astype(np.float64)
    want = np.stack([a[i].astype(np.float64) @ w64[i * n:(i + 1) * n].T for i in range(g)])
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_packed_contraction_and_row_gather_f16_words(rand, rng):
    n, k = 6, 8
    w16 = rand((n, k), F16)
    words = f16_words(w16)
    pw = PackedWeight("dense:f16words", (n, k))
    a = rand((3, k))
    got = ev(O.PackedContraction(pw), a, words)
    np.testing.assert_allclose(got, a.astype(np.float64) @ w16.astype(np.float64).T,
                               rtol=1e-5, atol=1e-5)
    ids = rng.integers(0, n, (4,)).astype(np.int32)
    np.testing.assert_array_equal(ev(O.PackedRowGather(pw), ids, words),
                                  w16.astype(np.float32)[ids])
    with pytest.raises(ShapeError, match=r"^PackedContraction: source 'words' must be"):
        O.PackedContraction(pw).infer([T((3, k)), T((n, k), U32)])


def test_indexed_packed_contraction_f16_words(rand, rng):
    e, n, k, m = 3, 4, 6, 5
    w16 = rand((e * n, k), F16)
    x = rand((m, k))
    idx = rng.integers(0, e, m).astype(np.int32)
    got = ev(O.IndexedPackedContraction(PackedWeight("dense:f16words", (e * n, k)), e),
             x, idx, f16_words(w16))
    w64 = w16.astype(np.float64)
    want = np.stack([x[r].astype(np.float64) @ w64[idx[r] * n:(idx[r] + 1) * n].T
                     for r in range(m)])
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


# -- collectives ---------------------------------------------------------------------------
def test_collectives_over_one_rank_are_the_identity(rand):
    x = rand((3, 4))
    np.testing.assert_array_equal(ev(O.AllReduce(1), x), x)
    np.testing.assert_array_equal(ev(O.AllGather(1, 1), x), x)
    assert O.AllGather(4, -1).infer([T((3, 4))]) == T((3, 16))
    assert O.AllReduce(4).infer([T((3, 4))]) == T((3, 4))


@pytest.mark.parametrize("op", [O.AllGather(2, 0), O.AllReduce(2)], ids=lambda o: o.name)
def test_collectives_over_more_ranks_are_refused(op, rand):
    b = Builder("tp", compiler=True)
    x = b.const(T((3, 4)), "x")
    b.result(b.eqn(op, x))
    g = b.finish()
    with pytest.raises(UnsupportedOp, match=rf"{op.name} over 2 ranks .*\[op={op.name}, "
                                            r"backend=reference\]"):
        poot.evaluate(g, [rand((3, 4))])


# -- Scan ------------------------------------------------------------------------------------
def test_scan_rule_and_definition_agree_with_a_python_loop(rand):
    n, d = 5, 3
    decay = rand((d,))

    def f(h0, xs, a):
        return poot.ops.scan(lambda h, x: poot.ops.tanh(poot.ops.add(poot.ops.mul(h, 0.9), x)),
                             h0, [xs], n)

    g = poot.trace(f, poot.spec((d,), name="h0"), poot.spec((n, d), name="xs"),
                   poot.spec((d,), name="a"))
    (eqn,) = g.eqns()
    assert isinstance(eqn.op, O.Scan) and not eqn.op.compiler_only and eqn.op.composite
    h0, xs = rand((d,)), rand((n, d))
    (got,) = poot.evaluate(g, [h0, xs, decay])
    h, want = h0.astype(np.float64), []
    for t in range(n):
        h = np.tanh(h * 0.9 + xs[t])
        want.append(h)
    np.testing.assert_allclose(got, np.stack(want), rtol=1e-5, atol=1e-6)
    types = [g.type_of(v) for v in g.inputs()[:2]]
    d_g = definition(eqn.op, types)
    assert not any(isinstance(e.op, O.Scan) for e in d_g.eqns())
    (by_def,) = poot.evaluate(d_g, [h0, xs], outputs="result")
    np.testing.assert_array_equal(by_def, got)
    with pytest.raises(ShapeError, match=r"^Scan: sequences must have a leading axis of "
                                         r"length 5"):
        eqn.op.infer([T((d,)), T((n + 1, d))])
    with pytest.raises(ShapeError, match=r"^Scan: body takes \[f32\[3\], f32\[3\]\]; "
                                         r"operands give \[f32\[3\], f32\[4\]\]"):
        eqn.op.infer([T((d,)), T((n, d + 1))])
    with pytest.raises(ShapeError, match=r"^Scan: length 0 must be at least 1"):
        poot.trace(lambda h, xs: poot.ops.scan(poot.ops.add, h, [xs], 0),
                   poot.spec((d,)), poot.spec((0, d)))


# -- infer and define agree --------------------------------------------------------------------
dims = st.integers(1, 3)


@settings(max_examples=80, deadline=None)
@given(st.integers(3, 4), st.data())
def test_attention_infer_accepts_exactly_what_its_definition_builds(rank, data):
    lead = tuple(data.draw(st.lists(dims, min_size=rank - 3, max_size=rank - 3)))
    hkv, g, t, s, d = (data.draw(dims) for _ in range(5))
    kl = tuple(data.draw(st.sampled_from([1, n, n + 1])) for n in lead)
    vl = tuple(data.draw(st.sampled_from([1, n])) for n in lead)
    full = data.draw(st.sampled_from([lead + (hkv * g, t, s), lead + (hkv, g, t, s)]))
    mrank = data.draw(st.integers(1, len(full)))
    ms = tuple(data.draw(st.sampled_from([1, n, n + 1])) for n in full[len(full) - mrank:])
    ins = [T(lead + (hkv * g, t, d)), T(kl + (hkv, s, d)), T(vl + (hkv, s, d)), T(ms)]
    op = O.Attention(0.5)
    try:
        out = op.infer(ins)
    except ShapeError as e:
        assert str(e).startswith("Attention: ")
        return
    dg = definition(op, ins)  # never fails where infer accepted
    assert dg.type_of(dg.result()) == out == T(lead + (hkv * g, t, d))
