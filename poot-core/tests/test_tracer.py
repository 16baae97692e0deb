"""poot.trace / poot.spec / Tensor: inputs of each kind, operators, declared binders and
outputs, and the typed refusals a model author meets."""
from __future__ import annotations

import numpy as np
import poot
import poot.ops as P
import pytest
from poot.dtypes import DType
from poot.errors import DtypeError, GraphError, ShapeError, TraceError
from poot.ir import Graph, OutputKind, SlotKind, StorageClass, TensorType, WeightRef
from poot.ir import ops as O

F32, I32 = DType.F32, DType.I32


def test_trace_returns_a_checked_graph_with_specs_as_binders():
    ref = WeightRef("m.safetensors", "model.w", payload="abc")
    def f(x, w, t, kv):
        P.state_update(kv, kv)
        return P.add(x, w)
    g = poot.trace(f, poot.spec((2, 3), "bf16", name="x"), poot.spec((3,), "bf16", weight=ref),
                   poot.spec((2,), "i32", name="tok", kind="slot", slot=SlotKind.TOKEN,
                             bound=100),
                   poot.spec((4,), name="kv", kind="state"), name="block")
    assert isinstance(g, Graph) and g.name == "block"
    x, w, t, kv = g.inputs()
    assert g.meta(x).storage.cls is StorageClass.CONST and g.meta(x).identity.label == "x"
    assert g.meta(w).identity.weight == ref
    assert g.slots()[0][0] == t and g.meta(t).storage.slot.valid_range() == (0, 100)
    assert g.meta(kv).storage.cls is StorageClass.STATE
    assert g.type_of(g.result()) == TensorType((2, 3), DType.BF16)
    assert g.state() == ((kv, kv),)


def test_state_without_update_is_refused():
    with pytest.raises(GraphError, match="State binders without a state_next output"):
        poot.trace(lambda s: P.add(s, 1.0), poot.spec((4,), kind="state"))
    g = poot.trace(lambda s: (P.state_update(s, P.add(s, 1.0)), s)[1],
                   poot.spec((4,), kind="state", name="s"))
    (s_in, s_out), = g.state()
    out, nxt = poot.evaluate(g, [np.arange(4, dtype=np.float32)])
    np.testing.assert_array_equal(nxt, np.arange(4) + 1)
    np.testing.assert_array_equal(out, np.arange(4))


def test_tensor_operators_record_the_library_ops(rand):
    def f(a, b):
        y = (a + b) * 2.0 - b / a
        y = 1.0 - y
        y = (-y) @ b.reshape(3, 2)
        return (y + 0.5).astype("bf16").reshape((4,))
    a, b = rand((2, 3)), rand((2, 3))
    g = poot.trace(f, poot.spec((2, 3)), poot.spec((2, 3)))
    kinds = [e.op for e in g.eqns()]
    assert O.MatMul() in kinds and O.Cast(DType.BF16) in kinds and O.Reshape((3, 2)) in kinds
    (got,) = poot.evaluate(g, [a, b])
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    want = (-(1 - ((a64 + b64) * 2 - b64 / a64))) @ b64.reshape(3, 2) + 0.5
    np.testing.assert_allclose(got.astype(np.float64), want.reshape(4), rtol=2 ** -7,
                               atol=1e-5)
    assert got.dtype == DType.BF16.numpy


def test_tensor_properties_and_reshape_minus_one():
    def f(x):
        assert x.shape == (2, 3, 4) and x.dtype is F32 and x.ndim == 3
        assert x.type == TensorType((2, 3, 4), F32)
        assert "Tensor(" in repr(x)
        y = P.reshape(x, (-1, 4))
        assert y.shape == (6, 4)
        assert P.reshape(y, (6, 4)) is y and P.cast(y, "f32") is y  # no idle eqns
        return y
    g = poot.trace(f, poot.spec((2, 3, 4)))
    assert len(g.eqns()) == 1


def test_scalars_take_the_tensor_dtype_and_refuse_fractions_for_ints(rand):
    g = poot.trace(lambda x: P.add(P.mul(x, np.float32(2)), 3), poot.spec((3,), "i32"))
    (got,) = poot.evaluate(g, [np.array([1, 2, 3], np.int32)])
    np.testing.assert_array_equal(got, [5, 7, 9])
    with pytest.raises(DtypeError, match="literal 0.5 is not an integer"):
        poot.trace(lambda x: P.mul(x, 0.5), poot.spec((3,), "i32"))
    with pytest.raises(TraceError, match="cannot trace operand of type ndarray"):
        poot.trace(lambda x: P.add(x, np.ones(3, np.float32)), poot.spec((3,)))
    with pytest.raises(TraceError, match="cannot trace operand of type str"):
        poot.trace(lambda x: P.add(x, "1"), poot.spec((3,)))
    with pytest.raises(TraceError, match="a scalar operand needs a tensor operand"):
        poot.trace(lambda x: P.add(1.0, 2.0), poot.spec((3,)))


def test_select_dtype_for_scalar_branches():
    g = poot.trace(lambda c: P.select(c, 1.0, -1.0, dtype="bf16"), poot.spec((3,), "i32"))
    (got,) = poot.evaluate(g, [np.array([0, 5, -2], np.int32)])
    assert got.dtype == DType.BF16.numpy and list(got.astype(float)) == [-1, 1, 1]


def test_binders_and_outputs_declared_inside_the_trace(rand):
    def f(x):
        w = P.const((3,), "f32", "w")
        pos = P.slot("Pos", (1,), "pos", bound=4)
        kv = P.state((4, 3), "f32", "kv")
        h = P.name(P.mul(x, w), "h")
        P.witness(h, "h_witness")
        P.export(h, "next_stage")
        P.state_update(kv, P.dynamic_update_slice(kv, P.reshape(h, (1, 3)), pos))
        return P.reduce_sum(h, 0)
    g = poot.trace(f, poot.spec((3,), name="x"))
    assert [o.kind for o in g.outputs()] == [OutputKind.RESULT, OutputKind.WITNESS,
                                            OutputKind.EXPORT, OutputKind.STATE_NEXT]
    assert "# h" in str(g)
    x, w, kv = rand((3,)), rand((3,)), rand((4, 3))
    res, wit, exp, nxt = poot.evaluate(g, {"x": x, "w": w, "pos": np.array([2]), "kv": kv})
    np.testing.assert_array_equal(wit, x * w)
    np.testing.assert_array_equal(exp, x * w)
    np.testing.assert_allclose(res, (x * w).sum(), rtol=1e-6, atol=1e-6)
    kv[2] = x * w
    np.testing.assert_array_equal(nxt, kv)


def test_trace_refusals():
    with pytest.raises(TraceError, match="no trace in progress: call poot.ops inside "
                                         "poot.trace"):
        P.iota((3,))
    with pytest.raises(TraceError, match="traced function must return a Tensor, got tuple"):
        poot.trace(lambda x: (x, x), poot.spec((2,)))
    with pytest.raises(TraceError, match="unknown spec kind 'weights': use const, slot or state"):
        poot.spec((2,), kind="weights")
    with pytest.raises(TraceError, match="a slot spec needs slot=<SlotKind>"):
        poot.spec((2,), "i32", kind="slot")
    with pytest.raises(TraceError, match="slot p: kind Pos holds i32, not f32"):
        poot.trace(lambda p: p, poot.spec((1,), "f32", name="p", kind="slot", slot="Pos"))
    with pytest.raises(DtypeError, match="unknown dtype 'f64'; known dtypes: "):
        poot.spec((2,), "f64")
    with pytest.raises(ShapeError, match=r"^MatMul: contraction sizes differ \(3 vs 2\)"):
        poot.trace(lambda a, b: a @ b, poot.spec((2, 3)), poot.spec((2, 2)))
    with pytest.raises(ShapeError, match=r"^Binary: shapes \(2, 3\) and \(2,\) do not broadcast"):
        poot.trace(lambda a, b: a + b, poot.spec((2, 3)), poot.spec((2,)))


def test_a_tensor_from_another_trace_is_refused():
    leaked = []
    poot.trace(lambda x: leaked.append(x) or x, poot.spec((2,)))
    with pytest.raises(GraphError, match="belongs to another graph; values cannot cross graphs"):
        poot.trace(lambda y: P.add(y, leaked[0]), poot.spec((2,)))
    with pytest.raises(GraphError, match="belongs to another graph"):
        poot.trace(lambda h, xs: P.scan(lambda c, x: P.add(P.add(c, x), h), h, [xs], 2),
                   poot.spec((2,)), poot.spec((2, 2)))


def test_traces_nest_and_restore_the_outer_builder():
    kept = []

    def outer(x):
        inner = poot.trace(lambda y: P.exp(y), poot.spec((2,)))
        assert len(inner.eqns()) == 1
        kept.append(x)
        return P.neg(x)
    g = poot.trace(outer, poot.spec((2,)))
    assert [e.op for e in g.eqns()] == [O.Unary(O.UnaryOp.Neg)]
    with pytest.raises(TraceError, match="no trace in progress"):
        P.neg(kept[0])  # the trace is over: its tensors record nothing any more
