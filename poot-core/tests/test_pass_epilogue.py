"""Epilogue fusion: a contraction and the pointwise chain that alone consumes it."""
from __future__ import annotations

from collections import Counter

import poot
from poot import ops
from poot.compiler import run_pass
from poot.compiler.validate import validate, validated_pass


def contracted(fn, *specs):
    """Trace, then form the dense contractions the epilogue pass starts from."""
    g, _ = run_pass(poot.trace(fn, *specs), "dense_contraction", "reference")
    return g


def epilogues(g):
    return [e for e in g.eqns() if e.op.name == "ContractionEpilogue"]


def test_bias_and_activation():
    g = contracted(lambda x, w, b: ops.gelu_erf(ops.linear(x, w, b)),
                   poot.spec((3, 8)), poot.spec((6, 8), "bf16"), poot.spec((6,)))
    out, rec = validated_pass(g, "epilogue")
    (ep,) = epilogues(out)
    assert len(out.eqns()) == 1 and ep.op.head.name == "DenseContraction"
    assert Counter(e.op.name for e in ep.op.body.eqns()) == Counter(
        {"Binary": 5, "Unary": 1})      # bias, then x*0.5*(1+erf(x/sqrt2))


def test_residual_and_swiglu_gate():
    def mlp(x, wg, wu, wd):
        h = ops.swiglu(ops.linear(x, wg), ops.linear(x, wu))
        return ops.add(x, ops.linear(h, wd))

    g = contracted(mlp, poot.spec((2, 8)), poot.spec((12, 8)), poot.spec((12, 8)),
                   poot.spec((8, 12)))
    out, rec = validated_pass(g, "epilogue", seed=5)
    gate, down = epilogues(out)
    assert [repr(e.op) for e in gate.op.body.eqns()] == ["Neg", "Exp", "Add", "Div", "Mul"]
    assert [repr(e.op) for e in down.op.body.eqns()] == ["Add"]
    assert Counter(e.op.name for e in out.eqns()) == Counter(
        {"ContractionEpilogue": 2, "DenseContraction": 1})     # up feeds the gate epilogue


def test_bf16_head_rounds_before_the_first_step():
    g = poot.trace(lambda a, b, c: ops.cast(ops.mul(ops.matmul(a, b), c), "f32"),
                   poot.spec((4, 8), "bf16"), poot.spec((8, 5), "bf16"),
                   poot.spec((5,), "bf16"))
    out, _ = validated_pass(g, "epilogue", seed=2)
    (ep,) = epilogues(out)
    first = ep.op.body.inputs()[0]
    assert str(ep.op.body.type_of(first).dtype) == "bf16"      # the head's dtype, not f32
    assert [repr(e.op) for e in ep.op.body.eqns()] == ["Mul", "Cast{to=f32}"]


def test_a_contraction_read_twice_keeps_its_own_eqn():
    def fn(x, w):
        y = ops.linear(x, w)
        return ops.add(ops.exp(y), ops.reduce_sum(y, -1, keepdim=True))

    g = contracted(fn, poot.spec((3, 8)), poot.spec((4, 8)))
    out, rec = validated_pass(g, "epilogue")
    assert not epilogues(out) and rec.rewrites == 0
    assert "alone" in rec.decisions[0].reason


def test_whole_pipeline_agrees_on_the_mlp():
    def mlp(x, wg, wu, wd, n):
        h = ops.rms_norm(x, n, 1e-5)
        return ops.add(x, ops.linear(ops.swiglu(ops.linear(h, wg), ops.linear(h, wu)), wd))

    g = poot.trace(mlp, poot.spec((3, 8)), poot.spec((12, 8), "bf16"),
                   poot.spec((12, 8), "bf16"), poot.spec((8, 12), "bf16"), poot.spec((8,)))
    compiled = poot.compile(g, "reference")
    validate(g, compiled.graph, seed=11)
    # the norm goes into gate (the SwiGLU epilogue's head) and up: 3 rows, two readers
    assert Counter(e.op.name for e in compiled.graph.eqns()) == Counter(
        {"ContractionEpilogue": 2, "NormedDenseContraction": 1})


def test_head_the_target_cannot_lower_keeps_its_chain():
    from poot.compiler import LimitedBackend
    from poot.plugin import get_backend

    g = poot.trace(lambda a, b: ops.tanh(ops.matmul(a, b)), poot.spec((4, 8)),
                   poot.spec((8, 5)))
    target = (LimitedBackend(get_backend("reference"), {"MatMul"}), None)
    out, rec = validated_pass(g, "epilogue", target)
    assert not epilogues(out) and "does not lower MatMul" in rec.decisions[0].reason
