"""Random chains of movement and arithmetic ops, planned and run against the oracle: the
arena, aliases, strided views (Transpose, Slice at offsets) and outputs must never mix up
bytes, whatever order the values live and die in."""
from __future__ import annotations

import numpy as np
import poot
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from poot import ops
from poot.plan import plan
from poot.runtime import Executor


def _random_chain(data, tok, table):
    values = [ops.reshape(ops.gather(table, tok), (2, 3, 4))]
    for _ in range(data.draw(st.integers(3, 14))):
        x = data.draw(st.sampled_from(values))
        kind = data.draw(st.sampled_from(["reshape", "transpose", "slice", "unary", "binary",
                                          "reduce", "matmul"]))
        if kind == "reshape":
            y = ops.reshape(x, (x.type.size,)) if x.ndim > 1 else ops.reshape(
                x, (1, x.type.size))
        elif kind == "transpose":
            perm = tuple(data.draw(st.permutations(range(x.ndim))))
            y = ops.transpose(x, perm)
        elif kind == "slice":
            axis = data.draw(st.integers(0, x.ndim - 1))
            n = x.shape[axis]
            start = data.draw(st.integers(0, n - 1))
            y = ops.slice_axis(x, axis, start, data.draw(st.integers(start + 1, n)))
        elif kind == "unary":
            y = data.draw(st.sampled_from([ops.neg, ops.tanh, ops.exp]))(x)
        elif kind == "binary":
            others = [v for v in values if v.shape == x.shape] + [x]
            y = data.draw(st.sampled_from([ops.add, ops.mul, ops.sub]))(
                x, data.draw(st.sampled_from(others)))
        elif kind == "reduce":
            y = ops.reduce_sum(x, data.draw(st.integers(0, x.ndim - 1)), keepdim=True)
        else:
            if x.ndim < 2:
                continue
            y = ops.matmul(x, ops.transpose(x, tuple(range(x.ndim - 2)) + (x.ndim - 1,
                                                                          x.ndim - 2)))
        values.append(y)
    for i, v in enumerate(values[1:-1]):
        if data.draw(st.booleans()):
            ops.witness(v, f"w{i}")
    return values[-1]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_random_chains_match_the_oracle(data):
    g = poot.trace(lambda tok, table: _random_chain(data, tok, table),
                   poot.spec((2,), "i32", name="tok", kind="slot", slot="Token", bound=5),
                   poot.spec((5, 12), name="table"))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16)))
    table = rng.standard_normal((5, 12)).astype(np.float32)
    ex = Executor(plan(g, "reference"), {"table": table})
    for _ in range(2):
        tok = rng.integers(0, 5, 2)
        got = ex.step({"tok": tok})
        want = poot.evaluate(g, {"tok": tok, "table": table})
        for o, w in zip(g.outputs(), want, strict=True):
            mine = got.result if o.kind.value == "result" else got.witnesses[o.label]
            np.testing.assert_array_equal(mine, w)
