"""Precision as a rewrite (docs/ir.md sections 10.8 and 15): QuantizeI8's rule in the oracle
and in its generic kernel, the q8 rows chain, the precision pass (exact changes nothing;
fast rounds the activations of 16-bit and integer-coded packed weights, once each), the
Q8PackedContraction it forms where declared, and the one-line refusals."""
from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
import poot
from poot.capability import Use
from poot.codegen.interp import run_lowering
from poot.codegen.lower import lower
from poot.compiler import LimitedBackend, Policy
from poot.compiler.policy import PrecisionError
from poot.compiler.precision import check, supported
from poot.dtypes import DType
from poot.errors import DtypeError, ShapeError
from poot.ir import Builder
from poot.ir import ops as O
from poot.ir.ops.quantize import q8_quantize, q8_round
from poot.ir.types import TensorType
from poot.models.llama import build_decoder, const_inputs, random_weights, tiny_config
from poot.oracle import apply, evaluate
from poot.plugin import get_backend

F32, I8 = DType.F32, DType.I8


def spec_codes(x: np.ndarray, d: np.ndarray) -> np.ndarray:
    """QuantizeI8 element by element in Python, each step an f32 operation."""
    out = np.empty(x.shape, np.int8)
    d = np.broadcast_to(d, x.shape)
    for i in np.ndindex(x.shape):
        inv = np.float32(0) if d[i] == 0 else np.float32(1) / np.float32(d[i])
        y = float(np.float32(x[i]) * inv)
        y = 0.0 if math.isnan(y) else min(max(y, -127.0), 127.0)
        out[i] = round(y)                     # Python rounds half to even
    return out


def edge_inputs():
    x = np.array([[0.0, -0.0, 1.5, 2.5, -2.5, -3.5, 0.49999997, 126.5, 127.49, 1e30, -1e30,
                   np.inf, -np.inf, np.nan, 7.0, -7.0]], np.float32)
    d = np.array([[1.0]], np.float32)
    return x, d


def test_quantize_rule_rounds_half_to_even_and_clamps():
    x, d = edge_inputs()
    ins = [TensorType(x.shape, F32), TensorType(d.shape, F32)]
    got = apply(O.QuantizeI8(), [x, d], ins, TensorType(x.shape, I8))
    assert got.tolist() == [[0, 0, 2, 2, -2, -4, 0, 126, 127, 127, -127, 127, -127, 0, 7, -7]]
    assert np.array_equal(got, spec_codes(x, d))


def test_quantize_scale_zero_gives_zero_codes_even_for_nonzero_x():
    # a subnormal block amax gives d = amax / 127 == 0: inv is 0, not inf
    x = np.full((1, 4), 1e-44, np.float32)
    d = np.zeros((1, 1), np.float32)
    t = [TensorType(x.shape, F32), TensorType(d.shape, F32)]
    assert not apply(O.QuantizeI8(), [x, d], t, TensorType(x.shape, I8)).any()


@pytest.mark.parametrize("seed", [0, 1])
def test_quantize_kernel_matches_the_oracle_bit_for_bit(seed):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((3, 5, 32)) * 4).astype(np.float32)
    d = np.abs(rng.standard_normal((3, 5, 1))).astype(np.float32)
    x[0, 0] = (np.arange(32) - 16 + 0.5).astype(np.float32)
    d[0, 0] = 1.0
    d[1, 1] = 0.0
    x[2, 2, :4] = [np.nan, np.inf, -np.inf, 0.0]
    ins = [TensorType(x.shape, F32), TensorType(d.shape, F32)]
    out = TensorType(x.shape, I8)
    got = run_lowering(lower(O.QuantizeI8(), ins, out), [x, d], out)
    assert np.array_equal(got, apply(O.QuantizeI8(), [x, d], ins, out))
    assert np.array_equal(got, spec_codes(x, d))


def test_quantize_type_rule():
    t = lambda shape, d=F32: TensorType(shape, d)  # noqa: E731
    assert O.QuantizeI8().infer([t((2, 4, 32)), t((2, 4, 1))]) == t((2, 4, 32), I8)
    with pytest.raises(DtypeError):
        O.QuantizeI8().infer([t((2, 32), DType.F16), t((2, 1))])
    with pytest.raises(ShapeError):
        O.QuantizeI8().infer([t((2, 32)), t((2, 2, 1))])     # the scales would widen x


def test_q8_round_is_ggufs_q8_0_with_half_even_codes():
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((2, 96)) * 3).astype(np.float32)
    x[1, 32:64] = 0.0
    b = Builder("q8")
    xr = b.const(TensorType(x.shape, F32), "x")
    q, d = q8_quantize(b, xr)
    b.result(q8_round(b, xr))
    b.witness(q, "codes")
    b.witness(d, "scales")
    got, codes, scales = evaluate(b.finish(), [x])
    blocks = x.reshape(2, 3, 32)
    want_d = (np.abs(blocks).max(-1, keepdims=True) / np.float32(127)).astype(np.float32)
    assert np.array_equal(scales, want_d)
    assert np.array_equal(codes, spec_codes(blocks, want_d))
    assert np.array_equal(got, (codes.astype(np.float32) * want_d).reshape(2, 96))
    assert not got[1, 32:64].any()


# -- the pass ------------------------------------------------------------------------------
CFG = tiny_config(dim=64, heads=2, kv_heads=1, head_dim=32, ffn=96)


def step(weights, **kw):
    return build_decoder(CFG, weights, tokens=1, **kw)


def inputs(st, weights, tokens=(3,)):
    g = st.graph
    ins = const_inputs(st, weights)
    ins.update(tokens=np.array(tokens), pos=np.array([0]))
    for v in g.state():
        m = g.meta(v[0])
        ins[m.identity.label] = np.zeros(m.aval.shape, m.aval.dtype.numpy)
    return ins


def counts(g) -> dict:
    """Eqns by op name; a fused contraction also counts its head."""
    out: dict = {}
    for e in g.eqns():
        for op in (e.op, getattr(e.op, "head", None)):
            if op is not None:
                out[op.name] = out.get(op.name, 0) + 1
    return out


def test_exact_is_todays_compile():
    w = random_weights(CFG, packed_format="gguf:Q4_0")
    st = step(w)
    before = poot.compile(st.graph, "reference")
    exact = poot.compile(st.graph, "reference", policy=Policy(precision="exact"))
    assert str(exact.graph) == str(before.graph)
    rec = {r.name: r for r in exact.report.passes}
    assert rec["precision"].eqns_before == rec["precision"].eqns_after


def test_fast_quantizes_integer_packed_activations_into_q8_contractions():
    w = random_weights(CFG, packed_format="gguf:Q4_0")
    st = step(w)
    fast = poot.compile(st.graph, "reference", policy=Policy(precision="fast"))
    c = counts(fast.graph)
    # per layer: q|k|v stacked, output, gate|up stacked, down; and the head
    assert c["Q8PackedContraction"] == 4 * CFG.layers + 1 and "PackedContraction" not in c
    ins = inputs(st, w)
    (got,) = evaluate(fast.graph, ins, outputs="result")
    (exact,) = evaluate(st.graph, ins, outputs="result")
    assert not np.array_equal(got, exact)                   # rounded activations differ ...
    assert np.abs(got - exact).max() < 0.05 * np.abs(exact).max()   # ... a little


def test_fast_matches_its_own_primitive_rewrite():
    """Compile's later passes keep the precision pass's meaning (translation validation)."""
    from poot.compiler import run_pass

    w = random_weights(CFG, packed_format="gguf:Q8_0")
    st = step(w)
    policy = Policy(precision="fast")
    rewritten, rec = run_pass(st.graph, "precision", "reference", policy=policy)
    assert rec.eqns_after > rec.eqns_before
    assert counts(rewritten)["QuantizeI8"] == 4 * CFG.layers + 1
    fast = poot.compile(st.graph, "reference", policy=policy)
    ins = inputs(st, w)
    np.testing.assert_allclose(evaluate(fast.graph, ins, outputs="result")[0],
                               evaluate(rewritten, ins, outputs="result")[0], rtol=2e-5,
                               atol=2e-5)


def test_fast_rounds_16bit_activations_to_the_weights_dtype_once_each():
    from poot.compiler import run_pass

    for dtype, cast in (("bf16", DType.BF16), ("f16", DType.F16), ("f16words", DType.F16)):
        w = random_weights(CFG, dtype=dtype)
        g, rec = run_pass(step(w).graph, "precision", "reference",
                          policy=Policy(precision="fast"))
        narrow = [e for e in g.eqns() if isinstance(e.op, O.Cast) and e.op.to is cast and
                  g.type_of(e.inputs[0].id).dtype is F32]
        # q|k|v, output, gate|up, down per layer and the head: one rounding each
        assert len(narrow) == 4 * CFG.layers + 1, dtype
        assert not any(isinstance(e.op, O.QuantizeI8) for e in g.eqns())


def test_fast_leaves_f32_and_float_coded_weights_alone():
    from poot.compiler import run_pass

    for w in (random_weights(CFG), random_weights(CFG, packed_format="fp8:e4m3")):
        st = step(w)
        g, rec = run_pass(st.graph, "precision", "reference", policy=Policy(precision="fast"))
        assert g is st.graph
        assert any("activations stay f32" in d.reason for d in rec.decisions)


def test_k_not_in_whole_blocks_keeps_f32_rows_and_says_why():
    from poot.compiler import run_pass
    from poot.formats import PackedWeight

    b = Builder("odd")
    x = b.const(TensorType((2, 48), F32), "x")
    wt = b.const(TensorType((8, 48), DType.BF16), "w")
    b.result(b.eqn(O.MatMul(), x, b.eqn(O.Transpose((1, 0)), b.eqn(O.Cast(F32), wt))))
    g, _ = run_pass(b.finish(), "precision", "reference", policy=Policy(precision="fast"))
    assert any(isinstance(e.op, O.Cast) and e.op.to is DType.BF16 for e in g.eqns())
    # an integer-coded weight whose K is no whole number of blocks keeps f32 rows
    from poot.compiler.passes.precision import rounding
    from poot.compiler.view import GraphView, NoMatch

    pw = PackedWeight("gptq:int4", (8, 48), {"group_size": 16})
    b = Builder("odd_packed")
    x = b.const(TensorType((2, 48), F32), "x")
    srcs = [b.const(s.type, s.role) for s in pw.sources()]
    mm = b.eqn(O.MatMul(), x, b.eqn(O.Transpose((1, 0)), b.eqn(O.PackedDequant(pw), *srcs)))
    b.result(mm)
    g = b.finish()
    view = GraphView(g)
    with pytest.raises(NoMatch, match="not a multiple of the q8 block"):
        rounding(view, g.producer(mm.id))


def test_without_the_composite_the_chain_stays_and_runs():
    w = random_weights(CFG, packed_format="gguf:Q4_1")
    st = step(w)
    limited = LimitedBackend(get_backend("reference"), {"Q8PackedContraction"})
    fast = poot.compile(st.graph, limited, policy=Policy(precision="fast"))
    c = counts(fast.graph)
    assert "Q8PackedContraction" not in c and c["QuantizeI8"] == 4 * CFG.layers + 1
    assert "target refuses" in fast.explain()
    ref = poot.compile(st.graph, "reference", policy=Policy(precision="fast"))
    ins = inputs(st, w)
    np.testing.assert_allclose(evaluate(fast.graph, ins, outputs="result")[0],
                               evaluate(ref.graph, ins, outputs="result")[0], rtol=2e-5,
                               atol=2e-5)


# -- names and refusals ------------------------------------------------------------------------
def table(backend):
    return backend.capabilities(backend.default_device())


def test_unknown_names_are_one_line_errors():
    t = table(get_backend("reference"))
    with pytest.raises(PrecisionError, match="unknown precision 'turbo'; the precisions are "
                       "exact, fast"):
        check(t, "turbo")
    with pytest.raises(PrecisionError, match="unknown KV dtype 'q4_0'; the KV dtypes are "
                       "f32, f16, q8_0"):
        check(t, "exact", "q4_0")
    with pytest.raises(PrecisionError, match="unknown precision"):
        Policy(precision="fastest")
    assert check(t, "fast") == "f16" and check(t, "exact") == "f32"
    assert check(t, "fast", "q8_0") == "q8_0"


def test_a_backend_that_cannot_run_a_level_names_what_it_supports():
    limited = LimitedBackend(get_backend("reference"), {"QuantizeI8"})
    t = table(limited)
    assert supported(t) == ["exact"]
    with pytest.raises(PrecisionError) as err:
        check(t, "fast")
    msg = str(err.value)
    assert "cannot run precision 'fast'" in msg and "QuantizeI8" in msg and \
        msg.endswith("it supports precisions exact") and "\n" not in msg
    with pytest.raises(PrecisionError, match="supports KV dtypes f32, f16$"):
        check(t, "exact", "q8_0")


def test_a_device_without_f16_storage_refuses_an_f16_cache():
    t = table(get_backend("reference"))
    t = replace(t, dtypes={**t.dtypes, DType.F16: Use.NONE})
    with pytest.raises(PrecisionError, match="KV dtype 'f16'.*supports KV dtypes f32, q8_0"):
        check(t, "fast")
    assert check(t, "fast", "q8_0") == "q8_0"


def test_q8_cache_needs_whole_blocks_of_head_dim():
    with pytest.raises(PrecisionError, match="head dimension; this model's is 16"):
        build_decoder(tiny_config(), random_weights(tiny_config()), kv_dtype="q8_0")
    with pytest.raises(PrecisionError, match="unknown KV dtype"):
        build_decoder(CFG, random_weights(CFG), kv_dtype="int4")


def test_kv_dtypes_trace_their_states():
    w = random_weights(CFG)
    for kv in ("dense", "paged"):
        default = build_decoder(CFG, w, kv=kv).graph
        assert str(build_decoder(CFG, w, kv=kv, kv_dtype="f32").graph) == str(default)
        states = lambda g: {g.meta(v).identity.label: g.type_of(v)  # noqa: E731
                            for v, _ in g.state()}
        f16 = states(build_decoder(CFG, w, kv=kv, kv_dtype="f16").graph)
        assert {t.dtype for t in f16.values()} == {DType.F16}
        q8 = states(build_decoder(CFG, w, kv=kv, kv_dtype="q8_0").graph)
        name = "blk.0.k_cache" if kv == "dense" else "blk.0.k_pool"
        assert q8[name].dtype is I8 and q8[name + ".scales"].dtype is F32
        assert q8[name + ".scales"].shape == q8[name].shape[:-1] + (1,)
        assert len(q8) == 2 * len(f16)


def test_the_cli_flags_reach_load():
    import argparse

    from poot.cli.run import add_parser

    sub = argparse.ArgumentParser().add_subparsers()
    add_parser(sub)
    args = sub.choices["run"].parse_args(["smollm2", "--prompt", "hi", "--precision", "fast",
                                          "--kv-dtype", "q8_0"])
    assert (args.precision, args.kv_dtype) == ("fast", "q8_0")
    args = sub.choices["run"].parse_args(["smollm2", "--prompt", "hi"])
    assert (args.precision, args.kv_dtype) == ("exact", None)
