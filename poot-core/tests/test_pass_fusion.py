"""Pointwise fusion (Fused) and reduction-rooted row fusion (FusedRow)."""
from __future__ import annotations

from collections import Counter

import poot
from poot import ops
from poot.compiler import LimitedBackend
from poot.compiler.validate import validated_pass
from poot.plugin import get_backend


def kinds(g) -> Counter:
    return Counter(e.op.name for e in g.eqns())


def test_rms_norm_is_one_row_region():
    g = poot.trace(lambda x, w: ops.rms_norm(x, w, 1e-5), poot.spec((5, 16)), poot.spec((16,)))
    out, rec = validated_pass(g, "fusion")
    (row,) = out.eqns()
    assert row.op.name == "FusedRow" and len(row.op.body.eqns()) == 7


def test_softmax_is_one_row_region():
    g = poot.trace(lambda x: ops.softmax(x), poot.spec((2, 3, 9)))
    out, _ = validated_pass(g, "fusion")
    (row,) = out.eqns()
    assert row.op.name == "FusedRow" and len(row.op.body.eqns()) == 5


def test_pointwise_chain_is_one_region():
    g = poot.trace(lambda x, y: ops.mul(ops.gelu_erf(x), ops.tanh(y)),
                   poot.spec((4, 6)), poot.spec((6,)))
    out, _ = validated_pass(g, "fusion")
    assert kinds(out) == Counter({"Fused": 1, "Unary": 1})      # tanh(y) has another shape


def test_concat_is_a_boundary():
    def fn(x, y):
        a = ops.exp(ops.neg(x))
        return ops.sqrt(ops.mul(ops.concat([a, y], -1), 2.0))

    g = poot.trace(fn, poot.spec((3, 4)), poot.spec((3, 4)))
    out, rec = validated_pass(g, "fusion")
    assert kinds(out) == Counter({"Fused": 2, "Concat": 1})


def test_value_read_outside_stops_the_region():
    def fn(x):
        e = ops.exp(x)
        ops.witness(e, "e")
        return ops.mul(ops.neg(e), 3.0)

    g = poot.trace(fn, poot.spec((4,)))
    out, _ = validated_pass(g, "fusion")
    assert kinds(out) == Counter({"Fused": 1, "Unary": 1})      # exp alone, neg*3 fused
    assert [o.label for o in out.outputs()] == [None, "e"]


def test_target_without_row_regions():
    ref = get_backend("reference")
    g = poot.trace(lambda x: ops.softmax(x), poot.spec((2, 9)))
    out, rec = validated_pass(g, "fusion", (LimitedBackend(ref, {"FusedRow"}), None))
    assert "FusedRow" not in kinds(out) and "does not lower FusedRow" in str(rec.decisions[0])
