"""Common-subexpression elimination."""
from __future__ import annotations

from collections import Counter

import poot
from poot import ops
from poot.compiler.validate import validated_pass


def test_repeats_are_computed_once():
    def fn(x, table, ids):
        a = ops.gather(table, ids)
        b = ops.gather(table, ids)                 # the same rows again
        ops.witness(ops.exp(ops.mul(x, 2.0)), "w")
        return ops.add(ops.mul(a, ops.exp(ops.mul(x, 2.0))), b)

    g = poot.trace(fn, poot.spec((3, 4)), poot.spec((6, 4)),
                   poot.spec((3,), "i32", kind="slot", slot="Token", bound=6))
    out, rec = validated_pass(g, "cse")
    assert Counter(e.op.name for e in out.eqns()) == Counter(
        {"Gather": 1, "Binary": 3, "Unary": 1})
    assert rec.rewrites == 3
    (witness,) = [o for o in out.outputs() if o.label == "w"]
    (mul,) = [e for e in out.eqns() if e.out == witness.value]    # the witness reads the
    assert repr(mul.op) == "Exp"                                    # one exp left


def test_signed_zero_literals_are_not_merged():
    g = poot.trace(lambda x: ops.add(ops.mul(x, 0.0), ops.mul(x, -0.0)), poot.spec((4,)))
    out, rec = validated_pass(g, "cse")
    assert rec.rewrites == 0 and len(out.eqns()) == 3
