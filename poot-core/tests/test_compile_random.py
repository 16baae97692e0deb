"""Translation validation on random primitive graphs (hypothesis): after every pass of the
pipeline, the oracle on the rewritten graph equals it on the source graph."""
from __future__ import annotations

import numpy as np
import poot
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from poot import ops
from poot.compiler import PASSES, run_pass
from poot.compiler.validate import validate
from poot.formats import PackedWeight

R, C = 3, 8
STEPS = ["unary", "binary", "reduce", "softmax", "rms_norm", "linear", "concat", "rope",
         "swiglu", "attention", "witness", "round_trip", "packed_linear", "embedding"]
WORDS = PackedWeight("dense:f16words", (C, C))


def build(program: list[tuple[int, int, int, int]]):
    """Trace a graph from a list of (step, operand a, operand b, variant) draws."""
    def fn(x0, x1, v, pos):
        pool = [x0, x1, ops.mul(x0, v)]
        full = lambda i: [t for t in pool if t.shape == (R, C)][i % len(
            [t for t in pool if t.shape == (R, C)])]
        counter = [0]

        def const(shape, dtype="f32"):
            counter[0] += 1
            return ops.const(shape, dtype, f"c{counter[0]}")

        for step, a, b, variant in program:
            x, y, any_a = full(a), full(b), pool[a % len(pool)]
            name = STEPS[step]
            if name == "unary":
                out = [ops.exp, ops.neg, ops.tanh, ops.erf][variant % 4](any_a)
            elif name == "binary":
                out = [ops.add, ops.sub, ops.mul, ops.maximum][variant % 4](
                    any_a, pool[b % len(pool)])
            elif name == "reduce":
                out = [ops.reduce_sum, ops.reduce_max][variant % 2](x, -1, keepdim=True)
            elif name == "softmax":
                out = ops.softmax(x)
            elif name == "rms_norm":
                out = ops.rms_norm(x, const((C,)), 1e-5)
            elif name == "linear":
                bias = const((C,)) if variant % 2 else None
                out = ops.linear(x, const((C, C), ["f32", "bf16", "f16"][variant % 3]), bias)
            elif name == "concat":
                out = ops.concat([ops.slice_axis(x, -1, 0, 4), ops.slice_axis(y, -1, 4, C)], -1)
            elif name == "rope":
                out = ops.rope_partial(x, const((8, 4)), const((8, 4)), ops.positions(pos, R))
            elif name == "swiglu":
                out = ops.swiglu(x, y)
            elif name == "attention":
                q = ops.reshape(x, (1, R, C))
                kv = ops.reshape(y, (1, R, C))
                mask = ops.causal_mask(pos, R, R) if variant % 2 else const((R, R))
                out = ops.reshape(ops.attention_masked(q, kv, kv, mask), (R, C))
            elif name == "packed_linear":
                out = ops.linear(x, ops.PackedTensor(WORDS, (const((C, C // 2), "u32"),)))
            elif name == "embedding":
                table = const((C, C), ["f32", "bf16"][variant % 2])
                out = ops.embedding(table, ops.positions(pos, R))
            elif name == "witness":
                ops.witness(any_a, f"w{len(pool)}")
                continue
            else:
                out = ops.cast(ops.cast(x, "bf16"), "f32")
            pool.append(out)
        return ops.add(pool[-1], full(0)) if pool[-1].shape != (R, C) else pool[-1]

    return poot.trace(fn, poot.spec((R, C), name="x0"), poot.spec((R, C), name="x1"),
                      poot.spec((C,), name="v"),
                      poot.spec((1,), "i32", name="pos", kind="slot", slot="Pos", bound=6))


programs = st.lists(st.tuples(st.integers(0, len(STEPS) - 1), st.integers(0, 50),
                              st.integers(0, 50), st.integers(0, 11)), min_size=1, max_size=9)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(program=programs, seed=st.integers(0, 2 ** 16))
def test_every_pass_keeps_the_oracle(program, seed):
    source = build(program)
    g = source
    for name, _ in PASSES:
        g, _ = run_pass(g, name, "reference")
        validate(source, g, seed=seed, trials=1, rtol=1e-4)
    assert len(g.eqns()) <= len(source.eqns())


def test_a_wrong_rewrite_is_caught():
    """The validator itself fails on a graph that computes something else."""
    a = build([(0, 0, 0, 0)])
    b = build([(0, 0, 0, 1)])
    try:
        validate(a, b, seed=1)
    except poot.errors.PootError as exc:
        assert "differs after compile" in str(exc)
    else:  # pragma: no cover
        raise AssertionError("validate accepted a different graph")
    assert np.isfinite(1.0)
