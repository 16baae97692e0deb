"""poot.ops compositions: each records the primitive chain the spec shows, and evaluates on
the oracle to the numpy formula written here, on fresh random inputs."""
from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import poot
import poot.ops as P
import pytest
from poot.dtypes import DType
from poot.errors import FormatError
from poot.formats import PackedWeight
from poot.ir import ops as O

F32, BF16, I32 = DType.F32, DType.BF16, DType.I32


def chain(g):
    """The eqns' ops as short names: Mul, Reduce.Sum, Sqrt, ..."""
    return [f"Reduce.{e.op.op.name}" if isinstance(e.op, O.Reduce) else
            (e.op.op.name if isinstance(e.op, (O.Unary, O.Binary)) else e.op.name)
            for e in g.eqns()]


def spec_of(a, name, **kw):
    return poot.spec(a.shape, DType.of(a), name=name, **kw)


def pos_spec(bound, name="pos", shape=(1,)):
    return poot.spec(shape, "i32", name=name, kind="slot", slot="Pos", bound=bound)


def test_rms_norm_is_the_seven_eqns(rand):
    x, w = rand((4, 16)), rand((16,))
    g = poot.trace(lambda x, w: P.rms_norm(x, w, 1e-5), spec_of(x, "x"), spec_of(w, "w"))
    assert chain(g) == ["Mul", "Reduce.Sum", "Mul", "Add", "Sqrt", "Div", "Mul"]
    assert g.eqns()[1].op == O.Reduce(O.ReduceOp.Sum, -1, True)
    (got,) = poot.evaluate(g, [x, w])
    x64 = x.astype(np.float64)
    want = x64 / np.sqrt(np.mean(x64 * x64, -1, keepdims=True) + 1e-5) * w
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("axis", [-1, 0])
def test_softmax_is_the_five_eqns(axis, rand):
    x = rand((5, 7), scale=4)
    g = poot.trace(lambda x: P.softmax(x, axis), spec_of(x, "x"))
    assert chain(g) == ["Reduce.Max", "Sub", "Exp", "Reduce.Sum", "Div"]
    (got,) = poot.evaluate(g, [x])
    e = np.exp(x.astype(np.float64) - x.max(axis, keepdims=True))
    np.testing.assert_allclose(got, e / e.sum(axis, keepdims=True), rtol=1e-6)
    np.testing.assert_allclose(got.sum(axis), 1, rtol=1e-6)


def test_softmax_is_stable_for_large_logits(rand):
    x = rand((3, 6)) + np.float32(1e4)
    g = poot.trace(P.softmax, spec_of(x, "x"))
    (got,) = poot.evaluate(g, [x])
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got.sum(-1), 1, rtol=1e-6)


def test_swiglu_silu_gelu(rand):
    a, b = rand((3, 8)), rand((3, 8))
    g = poot.trace(P.swiglu, spec_of(a, "gate"), spec_of(b, "up"))
    (got,) = poot.evaluate(g, [a, b])
    a64 = a.astype(np.float64)
    np.testing.assert_allclose(got, a64 / (1 + np.exp(-a64)) * b, rtol=1e-6)
    g = poot.trace(P.gelu_erf, spec_of(a, "x"))
    (got,) = poot.evaluate(g, [a])
    erf = np.vectorize(math.erf)
    np.testing.assert_allclose(got, 0.5 * a64 * (1 + erf(a64 / math.sqrt(2))), rtol=1e-6,
                               atol=1e-7)


def test_rope_partial_rotate_half_from_tables(rand, rng):
    h, t, d, rot, cap = 2, 3, 12, 8, 20
    cos_t, sin_t = P.rope_tables(cap, rot, base=10000.0)
    x = rand((h, t, d))
    positions = rng.integers(0, cap, t).astype(np.int32)

    def f(x, c, s, p):
        return P.rope_partial(x, c, s, p, rot)
    g = poot.trace(f, spec_of(x, "x"), spec_of(cos_t, "cos"), spec_of(sin_t, "sin"),
                   poot.spec((t,), "i32", name="p", kind="slot", slot="Pos", bound=cap))
    assert chain(g)[:2] == ["Gather", "Gather"] and chain(g)[-1] == "Concat"
    (got,) = poot.evaluate(g, [x, cos_t, sin_t, positions])
    inv = 10000.0 ** (-np.arange(0, rot, 2) / rot)
    ang = positions[:, None] * inv[None, :]                  # [t, rot/2]
    x64 = x.astype(np.float64)
    x1, x2 = x64[..., : rot // 2], x64[..., rot // 2: rot]
    want = np.concatenate([x1 * np.cos(ang) - x2 * np.sin(ang),
                           x1 * np.sin(ang) + x2 * np.cos(ang), x64[..., rot:]], -1)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    # the rotation keeps each pair's norm
    np.testing.assert_allclose(np.hypot(got[..., :rot // 2], got[..., rot // 2:rot]),
                               np.hypot(x1, x2), rtol=1e-5)


@pytest.mark.parametrize("t,window", [(1, None), (4, None), (3, 4)])
def test_causal_mask_from_pos_and_iota(t, window, rng):
    s = 10
    pos = int(rng.integers(0, s - t + 1))
    g = poot.trace(lambda p: P.causal_mask(p, t, s, window), pos_spec(s))
    assert "Iota" in chain(g) and "Select" in chain(g)
    assert not g.consts()  # built in-graph: no mask input
    (got,) = poot.evaluate(g, [np.array([pos], np.int32)])
    want = np.full((t, s), -np.inf, np.float32)
    for i in range(t):
        for j in range(s):
            if j <= pos + i and (window is None or j > pos + i - window):
                want[i, j] = 0
    np.testing.assert_array_equal(got, want)


def attention64(q, k, v, mask, scale):
    g = q.shape[-3] // k.shape[-3]
    k, v = np.repeat(k.astype(np.float64), g, -3), np.repeat(v.astype(np.float64), g, -3)
    s = q.astype(np.float64) @ np.swapaxes(k, -1, -2) * scale + mask
    e = np.exp(s - s.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True) @ v


@pytest.mark.parametrize("hq,hkv,t,window", [(4, 4, 1, None), (4, 2, 3, None),
                                             (6, 3, 2, 3), (2, 1, 5, None)])
def test_attention_masked_causal_sliding_gqa(hq, hkv, t, window, rand, rng):
    s, d = 9, 8
    q, k, v = rand((hq, t, d)), rand((hkv, s, d)), rand((hkv, s, d))
    pos = int(rng.integers(0, s - t + 1))

    def f(q, k, v, p):
        return P.attention_masked(q, k, v, P.causal_mask(p, t, s, window))
    g = poot.trace(f, spec_of(q, "q"), spec_of(k, "k"), spec_of(v, "v"), pos_spec(s))
    names = [n for n in chain(g) if n not in ("Reshape", "Transpose")]
    i = names.index("MatMul")
    assert names[i:] == ["MatMul", "Mul", "Add", "Reduce.Max", "Sub", "Exp", "Reduce.Sum",
                         "Div", "MatMul"]
    (got,) = poot.evaluate(g, [q, k, v, np.array([pos], np.int32)])
    mask = np.where((np.arange(s)[None] <= pos + np.arange(t)[:, None]) &
                    ((np.arange(s)[None] > pos + np.arange(t)[:, None] - window)
                     if window else True), 0, -np.inf)
    np.testing.assert_allclose(got, attention64(q, k, v, mask, 1 / math.sqrt(d)),
                               rtol=2e-5, atol=2e-6)


def test_attention_masked_matches_the_attention_composite(rand):
    q, k, v = rand((4, 2, 8)), rand((2, 6, 8)), rand((2, 6, 8))
    mask = np.where(rand((2, 6)) > 0.8, -np.inf, 0).astype(np.float32)
    mask[:, 0] = 0
    g = poot.trace(lambda *a: P.attention_masked(*a, scale=0.3), spec_of(q, "q"),
                   spec_of(k, "k"), spec_of(v, "v"), spec_of(mask, "m"))
    d = poot.oracle.definition(O.Attention(0.3), [g.type_of(x) for x in g.inputs()])
    assert [e.op for e in g.eqns()] == [e.op for e in d.eqns()]
    (a,) = poot.evaluate(g, [q, k, v, mask])
    (b,) = poot.evaluate(d, [q, k, v, mask])
    np.testing.assert_array_equal(a, b)


def test_linear_f32_bf16_bias_and_batch(rand):
    x, w, bias = rand((2, 3, 8)), rand((5, 8)), rand((5,))
    g = poot.trace(P.linear, spec_of(x, "x"), spec_of(w, "w"), spec_of(bias, "b"))
    (got,) = poot.evaluate(g, [x, w, bias])
    np.testing.assert_allclose(got, x.astype(np.float64) @ w.T + bias, rtol=1e-5, atol=1e-6)
    wb = rand((5, 8), BF16)
    g = poot.trace(P.linear, spec_of(x, "x"), spec_of(wb, "w"))
    assert "Cast" in chain(g)
    (got,) = poot.evaluate(g, [x, wb])
    np.testing.assert_allclose(got, x.astype(np.float64) @ wb.astype(np.float64).T, rtol=1e-5,
                               atol=1e-5)


def test_linear_packed_weight(rand):
    n, k = 6, 8
    w16 = rand((n, k), DType.F16)
    words = np.frombuffer(w16.astype("<f2").tobytes(), "<u4").reshape(n, k // 2)
    pw = PackedWeight("dense:f16words", (n, k))
    x = rand((3, k))

    def f(x):
        return P.linear(x, P.packed_const(pw, ["w.words"]))
    g = poot.trace(f, spec_of(x, "x"))
    assert "PackedDequant" in chain(g)
    (got,) = poot.evaluate(g, {"x": x, "w.words": words})
    np.testing.assert_allclose(got, x.astype(np.float64) @ w16.astype(np.float64).T, rtol=1e-5,
                               atol=1e-5)
    with pytest.raises(FormatError, match="dense:f16words has 1 sources, got 2 names"):
        poot.trace(lambda x: P.linear(x, P.packed_const(pw, ["a", "b"])), spec_of(x, "x"))


def test_embedding(rand, rng):
    table = rand((11, 4), BF16)
    ids = rng.integers(0, 11, (2, 3)).astype(np.int32)
    g = poot.trace(P.embedding, spec_of(table, "table"),
                   poot.spec((2, 3), "i32", name="tok", kind="slot", slot="Token", bound=11))
    assert chain(g) == ["Gather", "Cast"]  # a bf16 table's rows widen to f32
    (got,) = poot.evaluate(g, [table, ids])
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, np.stack([[table[i] for i in row] for row in ids])
                                  .astype(np.float32))
    t32 = table.astype(np.float32)
    g = poot.trace(P.embedding, spec_of(t32, "table"), spec_of(ids, "ids"))
    assert chain(g) == ["Gather"]
    np.testing.assert_array_equal(poot.evaluate(g, [t32, ids])[0], t32[ids])


def test_moe_route(rng):
    t, e, k = 5, 8, 3
    logits = rng.integers(-3, 3, (t, e)).astype(np.float32)  # ties: the lower expert first
    g = poot.trace(lambda x: poot.ops.concat([P.cast(P.moe_route(x, k)[0], "f32"),
                                              P.moe_route(x, k)[1]], -1),
                   spec_of(logits, "logits"))
    assert "ArgTopK" in chain(g)
    (got,) = poot.evaluate(g, [logits])
    ids, weights = got[:, :k].astype(int), got[:, k:]
    for r in range(t):
        want = sorted(range(e), key=lambda j: (-logits[r, j], j))[:k]
        assert list(ids[r]) == want
        z = np.exp(logits[r, want] - logits[r, want].max())
        np.testing.assert_allclose(weights[r], z / z.sum(), rtol=1e-6)


def test_kv_write_dense_at_pos(rand):
    hkv, cap, d, t = 2, 8, 4, 3
    cache, new = rand((hkv, cap, d)), rand((hkv, t, d))

    def f(c, n, p):
        nxt = P.kv_write_dense(c, n, p)
        P.state_update(c, nxt)
        return P.reduce_sum(nxt, -1)
    g = poot.trace(f, spec_of(cache, "cache", kind="state"), spec_of(new, "new"),
                   pos_spec(cap - t + 1))
    assert chain(g)[0] == "DynamicUpdateSlice"
    for pos in (0, 2, cap - t):
        res, nxt = poot.evaluate(g, [cache, new, np.array([pos], np.int32)])
        want = cache.copy()
        want[:, pos:pos + t] = new
        np.testing.assert_array_equal(nxt, want)
        np.testing.assert_allclose(res, want.sum(-1), rtol=1e-6, atol=1e-6)


def test_kv_paged_write_and_read(rand, rng):
    p, hkv, d, t, s = 10, 2, 3, 4, 5
    pool, new = rand((p, hkv, d)), rand((t, hkv, d))
    write_map = np.array([7, -1, 2, 9], np.int32)
    slot_map = rng.integers(0, p, s).astype(np.int32)

    def f(pool, new, wm, sm):
        nxt = P.kv_write_paged(pool, new, wm)
        P.state_update(pool, nxt)
        return P.kv_read_paged(nxt, sm)
    g = poot.trace(f, spec_of(pool, "pool", kind="state"), spec_of(new, "new"),
                   poot.spec((t,), "i32", name="wm", kind="slot", slot="WriteMap", bound=p),
                   poot.spec((s,), "i32", name="sm", kind="slot", slot="SlotMap", bound=p))
    assert chain(g) == ["ScatterUpdate", "Gather", "Transpose"]
    seq, nxt = poot.evaluate(g, [pool, new, write_map, slot_map])
    want = pool.copy()
    for row, slot in enumerate(write_map):
        if slot >= 0:
            want[slot] = new[row]
    np.testing.assert_array_equal(nxt, want)
    assert seq.shape == (hkv, s, d)
    for j in range(s):
        np.testing.assert_array_equal(seq[:, j], want[slot_map[j]])


def test_bf16_chain_rounds_each_step(rand):
    x = rand((4, 8), BF16)
    g = poot.trace(lambda x: P.mul(P.exp(x), x), spec_of(x, "x"))
    (got,) = poot.evaluate(g, [x])
    e = np.exp(x.astype(np.float32)).astype(ml_dtypes.bfloat16)
    np.testing.assert_array_equal(got, (e.astype(np.float32) * x.astype(np.float32))
                                  .astype(ml_dtypes.bfloat16))


def test_batched_positions_and_causal_masks(rng):
    b, t, s = 3, 2, 7
    pos = rng.integers(0, s - t + 1, (b, 1)).astype(np.int32)

    def f(p):
        return P.concat([P.cast(P.reshape(P.positions(p, t), (b, t, 1)), "f32"),
                         P.causal_mask(p, t, s, window=3)], -1)
    g = poot.trace(f, pos_spec(s, shape=(b, 1)))
    (got,) = poot.evaluate(g, [pos])
    np.testing.assert_array_equal(got[..., 0], pos + np.arange(t)[None, :])
    i = pos[:, :, None] + np.arange(t)[None, :, None]        # [b, t, 1]
    j = np.arange(s)[None, None, :]
    np.testing.assert_array_equal(got[..., 1:], np.where((j <= i) & (j > i - 3), 0, -np.inf))


def test_batched_attention_with_per_sequence_masks(rand, rng):
    b, hq, hkv, t, s, d = 2, 4, 2, 1, 6, 8
    q, k, v = rand((b, hq, t, d)), rand((b, hkv, s, d)), rand((b, hkv, s, d))
    pos = rng.integers(0, s, (b, 1)).astype(np.int32)

    def f(q, k, v, p):
        m = P.causal_mask(p, t, s)                               # [B, T, S]
        return P.attention_masked(q, k, v, P.reshape(m, (b, 1, t, s)))
    g = poot.trace(f, spec_of(q, "q"), spec_of(k, "k"), spec_of(v, "v"),
                   pos_spec(s, shape=(b, 1)))
    (got,) = poot.evaluate(g, [q, k, v, pos])
    mask = np.where(np.arange(s)[None, None, None, :] <= pos[:, None, :, None]
                    + np.arange(t)[None, None, :, None], 0, -np.inf)
    np.testing.assert_allclose(got, attention64(q, k, v, mask, 1 / math.sqrt(d)), rtol=2e-5,
                               atol=2e-6)


def test_rope_tokens_first(rand, rng):
    b, t, h, d, rot, cap = 2, 3, 2, 8, 4, 16
    cos_t, sin_t = P.rope_tables(cap, rot, base=500.0)
    x = rand((b, t, h, d))
    p = rng.integers(0, cap, (b, t)).astype(np.int32)
    g = poot.trace(lambda x, c, s, p: P.rope_partial(x, c, s, p, rot, tokens_first=True),
                   spec_of(x, "x"), spec_of(cos_t, "cos"), spec_of(sin_t, "sin"),
                   poot.spec((b, t), "i32", name="p", kind="slot", slot="Pos", bound=cap))
    (got,) = poot.evaluate(g, [x, cos_t, sin_t, p])
    ang = p[..., None, None] * (500.0 ** (-np.arange(0, rot, 2) / rot))  # [b, t, 1, rot/2]
    x64 = x.astype(np.float64)
    x1, x2 = x64[..., : rot // 2], x64[..., rot // 2: rot]
    want = np.concatenate([x1 * np.cos(ang) - x2 * np.sin(ang),
                           x1 * np.sin(ang) + x2 * np.cos(ang), x64[..., rot:]], -1)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
