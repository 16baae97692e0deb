"""Graph, Builder and GraphEdit: accessors, every Builder refusal, every whole-graph check
refusal (bad tables built through GraphEdit where the Builder cannot make them), every
GraphEdit refusal (and the original left unchanged), and the int-as-ValueId refusal."""
from __future__ import annotations

import numpy as np
import poot
import poot.ops
import pytest
from poot.dtypes import DType
from poot.errors import DtypeError, EditRefused, GraphError, PootError, ShapeError, TraceError
from poot.ir import (
    Builder,
    Eqn,
    GraphOutput,
    Identity,
    Lit,
    OutputKind,
    SlotKind,
    Storage,
    TensorType,
    Value,
    ValueId,
    ValueMeta,
    ValueTable,
    WeightRef,
)
from poot.ir import ops as O

F32, I32 = DType.F32, DType.I32
ADD, MUL, SUB = O.Binary(O.BinaryOp.Add), O.Binary(O.BinaryOp.Mul), O.Binary(O.BinaryOp.Sub)


def T(shape, dtype=F32):
    return TensorType(tuple(shape), dtype)


def layer_graph():
    """A graph with every kind of binder and output: const, weight, slot, state, computed;
    result, witness, export, state_next."""
    b = Builder("layer")
    x = b.const(T((2, 4)), "x")
    w = b.const(T((4,)), WeightRef("ckpt.gguf", "blk.0.w", payload="sha:1", format="f32"))
    pos = b.slot(SlotKind.POS, (1,), "pos", bound=8)
    cache = b.state(T((8, 4)), "cache")
    io = b.computed(O.Iota((2, 4), 1, F32), "iota")
    h = b.eqn(MUL, x, w)
    h = b.eqn(ADD, h, io)
    b.name_value(h, "h")
    row = b.eqn(O.Slice(0, 0, 1), h)
    nxt = b.eqn(O.DynamicUpdateSlice(0), cache, row, pos)
    out = b.eqn(O.Unary(O.UnaryOp.Tanh), h)
    b.witness(h, "pre_tanh")
    b.export(out, "stage1")
    b.state_next(cache, nxt)
    b.result(out)
    return b.finish(), dict(x=x, w=w, pos=pos, cache=cache, io=io, h=h, row=row, nxt=nxt,
                            out=out)


def snapshot(g):
    return (str(g), g.inputs(), g.eqns(), g.outputs(), g.slots(), g.state(),
            [g.meta(v) for v, _ in g.values()])


# -- accessors ---------------------------------------------------------------------------
def test_accessors_read_every_table():
    g, r = layer_graph()
    assert g.inputs() == tuple(r[k].id for k in ("x", "w", "pos", "cache", "io"))
    assert g.consts() == (r["x"].id, r["w"].id)
    assert g.computed() == (r["io"].id,)
    assert g.computed_def(r["io"].id) == O.Iota((2, 4), 1, F32)
    assert g.slots() == ((r["pos"].id, g.meta(r["pos"].id).storage.slot),)
    assert g.meta(r["pos"].id).storage.slot.valid_range() == (0, 8)
    assert g.state() == ((r["cache"].id, r["nxt"].id),)
    assert g.result() == r["out"].id
    assert [o.kind for o in g.outputs()] == [OutputKind.RESULT, OutputKind.WITNESS,
                                            OutputKind.EXPORT, OutputKind.STATE_NEXT]
    assert g.meta(r["w"].id).identity == Identity.of_weight(
        WeightRef("ckpt.gguf", "blk.0.w", "sha:1", "f32"))
    assert g.meta(r["h"].id).identity == Identity.named("h")
    assert g.meta(r["cache"].id).storage == Storage.STATE
    assert g.type_of(r["nxt"].id) == T((8, 4))
    assert g.producer(r["out"].id).op == O.Unary(O.UnaryOp.Tanh)
    assert g.producer(r["x"].id) is None
    users = g.users()
    assert [e.out for e in users[r["h"].id]] == [r["row"].id, r["out"].id]
    assert [v for v, _ in g.values()] == list(g.inputs()) + [e.out for e in g.eqns()]
    assert len(g.eqns()) == 5 and all(g.meta(e.out).storage == Storage.DEVICE
                                      for e in g.eqns())


def test_tables_are_not_reachable_for_change():
    g, _ = layer_graph()
    eqns = g.eqns()
    assert isinstance(eqns, tuple) and isinstance(g.outputs(), tuple)
    with pytest.raises(AttributeError):
        g.foo = 1  # __slots__: no ad-hoc state on a Graph


def test_the_graph_evaluates(rng):
    g, r = layer_graph()
    x = rng.standard_normal((2, 4)).astype(np.float32)
    w = rng.standard_normal(4).astype(np.float32)
    cache = rng.standard_normal((8, 4)).astype(np.float32)
    res, wit, exp, nxt = poot.evaluate(g, {"x": x, "blk.0.w": w, "pos": np.array([5]),
                                          "cache": cache})
    h = x * w + np.arange(4, dtype=np.float32)
    np.testing.assert_allclose(wit, h, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(res, np.tanh(h), rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(exp, res)
    want = cache.copy()
    want[5] = h[0]
    np.testing.assert_allclose(nxt, want, rtol=1e-6, atol=1e-6)


# -- Builder refusals --------------------------------------------------------------------
def test_builder_refuses_an_operand_from_another_graph():
    b1, b2 = Builder("one"), Builder("two")
    x1 = b1.const(T((2,)), "x")
    x2 = b2.const(T((2,)), "x")
    with pytest.raises(GraphError, match="belongs to another graph; values cannot cross graphs"):
        b2.eqn(ADD, x2, x1)
    with pytest.raises(GraphError, match="is not a value of this graph"):
        b2.result(x1)
    with pytest.raises(GraphError, match="is not a value of this graph"):
        b2.name_value(x1, "stolen")
    b2.result(x2)
    g = b2.finish()
    assert g.eqns() == ()


def test_builder_refuses_compiler_only_ops_unless_compiling():
    for op in (O.Attention(0.5), O.Rope(2), O.Fused(poot.trace(lambda x: x, poot.spec((2,)))),
               O.DenseContraction(), O.AllReduce(1), O.AllGather(1)):
        b = Builder("t")
        x = b.const(T((2, 2, 2)), "x")
        with pytest.raises(TraceError, match=f"{op.name} is a compiler-only composite"):
            b.eqn(op, x, x, x, x)


def test_tracer_refuses_compiler_only_ops():
    def f(x):
        from poot.tracer import builder
        return poot.tracer.Tensor(builder().eqn(O.AllReduce(1), x.ref))
    with pytest.raises(TraceError, match="AllReduce is a compiler-only composite: the tracer "
                                         "cannot emit it"):
        poot.trace(f, poot.spec((2,)))
    with pytest.raises(TraceError, match="Rope is introduced by compile"):
        poot.ops.compiler_only("Rope")


def test_builder_refuses_bad_operands_and_ops():
    b = Builder()
    x = b.const(T((2,)), "x")
    with pytest.raises(TypeError, match="pass a Ref from this builder, not a bare ValueId"):
        b.eqn(ADD, x, x.id)
    with pytest.raises(TypeError, match="operand must be a Ref or Lit, not int"):
        b.eqn(ADD, x, 3)
    with pytest.raises(TypeError, match="op must be an OpKind"):
        b.eqn("Add", x, x)
    with pytest.raises(ShapeError, match=r"^Binary: shapes \(2,\) and \(3,\) do not broadcast"):
        b.eqn(ADD, x, b.const(T((3,)), "y"))
    with pytest.raises(DtypeError, match=r"^Binary: operand dtypes differ \(f32 vs i32\)"):
        b.eqn(ADD, x, Lit(1, I32))


@pytest.mark.parametrize("case", ["no_result", "two_results", "missing_state_next",
                                  "state_next_of_const", "state_type", "foreign_output",
                                  "export_twice"])
def test_builder_refuses_bad_outputs(case):
    b = Builder(case)
    x = b.const(T((2,)), "x")
    y = b.eqn(ADD, x, x)
    if case == "no_result":
        b.witness(y, "w")
        with pytest.raises(GraphError, match="exactly one result output, found 0"):
            b.finish()
        return
    b.result(y)
    if case == "two_results":
        b.result(x)
        msg = "exactly one result output, found 2"
    elif case == "missing_state_next":
        b.state(T((2,)), "kv")
        msg = r"State binders without a state_next output: \[%2\]"
    elif case == "state_next_of_const":
        b.state_next(x, y)
        msg = "is not a State binder"
    elif case == "state_type":
        s = b.state(T((3,)), "kv")
        b.state_next(s, y)
        msg = r"state_out f32\[2\] differs from state_in f32\[3\]"
    elif case == "foreign_output":
        other = Builder().const(T((2,)), "z")
        with pytest.raises(GraphError, match="is not a value of this graph"):
            b.witness(other, "w")
        return
    else:
        b.export(x, "cut")
        b.export(y, "cut")
        msg = "export boundary missing or repeated"
    with pytest.raises(GraphError, match=msg):
        b.finish()


def test_builder_refuses_use_after_finish():
    b = Builder("done")
    x = b.const(T((2,)), "x")
    b.result(x)
    b.finish()
    with pytest.raises(GraphError, match="builder 'done' has finished its graph"):
        b.const(T((2,)), "y")
    with pytest.raises(GraphError, match="has finished"):
        b.eqn(ADD, x, x)


def test_slot_kinds_are_declared_with_one_type_rule():
    k = SlotKind.declare("TestAdapterIndex", I32, 0, 4, owner="tests")
    assert SlotKind.declare("TestAdapterIndex", I32, 0, 4, owner="other") is k
    assert SlotKind.get("TestAdapterIndex") is k
    with pytest.raises(PootError, match="already declared by tests with another type rule"):
        SlotKind.declare("TestAdapterIndex", I32, 0, 5)
    with pytest.raises(PootError, match="unknown slot kind 'NoSuchRole'; declared: "):
        SlotKind.get("NoSuchRole")
    b = Builder()
    s = b.slot(k, (1,), "adapter")
    assert s.type == T((1,), I32)
    b.result(s)
    g = b.finish()
    assert g.meta(s.id).storage.slot.valid_range() == (0, 4)


# -- whole-graph check refusals, through GraphEdit --------------------------------------
def small_graph():
    b = Builder("small")
    x = b.const(T((2,)), "x")
    y = b.eqn(ADD, x, x)
    z = b.eqn(MUL, y, x)
    b.result(z)
    return b.finish(), x.id, y.id, z.id


def test_check_refuses_an_ssa_violation():
    g, x, y, z = small_graph()
    d = g.edit()
    d.eqns.append(Eqn(SUB, (Value(x), Value(x)), y))  # y defined twice
    with pytest.raises(GraphError, match=r"eqn 2 \(Binary\) redefines %1: not SSA"):
        d.commit()
    d = g.edit()
    d.eqns.insert(0, Eqn(SUB, (Value(x), Value(x)), x))  # an eqn writing an input binder
    with pytest.raises(GraphError, match="redefines %0: not SSA"):
        d.commit()


def test_check_refuses_eqns_out_of_order():
    g, x, y, z = small_graph()
    d = g.edit()
    d.eqns.reverse()
    with pytest.raises(GraphError, match=r"eqn 0 \(Binary\) reads %1 before it is defined"):
        d.commit()
    d.toposort()  # the draft can repair its own order
    assert d.commit().eqns() == g.eqns()
    d = g.edit()
    d.eqns[0] = Eqn(ADD, (Value(x), Value(z)), y)  # y reads z, z reads y: a cycle
    with pytest.raises(GraphError, match="eqns form a cycle or read undefined values"):
        d.toposort()


def test_check_refuses_an_undefined_operand():
    g, x, y, z = small_graph()
    d = g.edit()
    ghost = d.new_value(T((2,)))  # in the table, defined by nothing
    d.eqns[1] = Eqn(MUL, (Value(y), Value(ghost)), z)
    with pytest.raises(GraphError, match=r"reads %3 before it is defined"):
        d.commit()
    d = g.edit()
    d.eqns[1] = Eqn(MUL, (Value(y), Value(ValueId(99))), z)
    with pytest.raises(GraphError, match="reads %99 before it is defined"):
        d.commit()
    d = g.edit()
    d.eqns.append(Eqn(MUL, (Value(y), Value(x)), ValueId(99)))
    with pytest.raises(GraphError, match="writes %99, not in the value table"):
        d.commit()
    b = Builder()
    x = b.const(T((2,)), "x")
    b.result(x)
    b._tables.outputs.append(GraphOutput(ghost, OutputKind.WITNESS, label="w"))
    with pytest.raises(GraphError, match=r"output witness %3 'w' names an undefined value"):
        b.finish()


def test_check_refuses_a_type_disagreeing_with_infer():
    g, x, y, z = small_graph()
    d = g.edit()
    wrong = d.new_value(T((2,), DType.F16))
    d.eqns.append(Eqn(ADD, (Value(z), Value(z)), wrong))
    with pytest.raises(GraphError, match=r"infers f32\[2\] but %3 is f16\[2\]"):
        d.commit()
    d = g.edit()
    d.eqns.append(Eqn(ADD, (Value(z), Lit(1, I32)), d.new_value(T((2,)))))
    with pytest.raises(DtypeError, match="^Binary: operand dtypes differ"):
        d.commit()


def test_check_refuses_a_result_not_of_device_storage():
    g, x, y, z = small_graph()
    d = g.edit()
    c = d.new_input(ValueMeta(T((2,)), Storage.CONST, Identity.named("c")))
    d.eqns.append(Eqn(ADD, (Value(z), Value(z)), c))
    with pytest.raises(GraphError, match="redefines %3: not SSA"):  # c is bound already
        d.commit()
    d = g.edit()
    # a table row of Const storage that no binder lists: only reachable through the draft's
    # private table, as a buggy pass would make it
    c = d._t.values.append(ValueMeta(T((2,)), Storage.CONST, Identity.named("c")))
    d.eqns.append(Eqn(ADD, (Value(z), Value(z)), c))
    with pytest.raises(GraphError, match="must have Device storage, not Const"):
        d.commit()


def test_check_refuses_state_pairs_of_different_types_and_missing_next():
    g, r = layer_graph()
    d = g.edit()
    (cache, nxt), = g.state()
    d.replace_uses(nxt, r["h"].id)  # state_next now names f32[2,4] for a f32[8,4] state
    with pytest.raises(GraphError, match=r"state_out f32\[2,4\] differs from state_in"):
        d.commit()
    d = g.edit()
    extra = d.new_input(ValueMeta(T((3,)), Storage.STATE, Identity.named("kv2")))
    with pytest.raises(GraphError, match=rf"State binders without a state_next output: "
                                         rf"\[{extra!r}\]"):
        d.commit()
    d = g.edit()
    i = next(i for i, o in enumerate(d.outputs) if o.kind is OutputKind.STATE_NEXT)
    d.outputs.append(d.outputs[i])
    with pytest.raises(EditRefused, match=r"lost: \[\], added: \['state_next %3'\]"):
        d.commit()
    b = Builder()
    s = b.state(T((2,)), "kv")
    b.state_next(s, b.eqn(ADD, s, s))
    b.state_next(s, b.eqn(MUL, s, s))
    b.result(s)
    with pytest.raises(GraphError, match="State binder %0 has two next values"):
        b.finish()


def test_check_refuses_two_results_and_tables_out_of_step():
    g, x, y, z = small_graph()
    d = g.edit()
    d.outputs.append(GraphOutput(y, OutputKind.RESULT))
    with pytest.raises(EditRefused, match=r"lost: \[\], added: \['result'\]"):
        d.commit()
    d = g.edit()
    d.inputs.append(x)
    with pytest.raises(GraphError, match="input %0 is bound twice"):
        d.commit()
    d = g.edit()
    d.new_input(ValueMeta(T(()), Storage.COMPUTED))  # no generator
    with pytest.raises(GraphError, match="has no generator"):
        d.commit()
    g2, r = layer_graph()
    d = g2.edit()
    d.slots.clear()
    with pytest.raises(GraphError, match="slots table does not match the Slot binders"):
        d.commit()
    d = g2.edit()
    vid, slot = d.slots[0]
    d.slots[0] = (vid, type(slot)(slot.kind, 99))  # same binder, another bound than its meta
    with pytest.raises(GraphError, match="slots table does not match the Slot binders"):
        d.commit()


# -- GraphEdit refusals ----------------------------------------------------------------
def edit_and_refuse(g, change, match):
    before = snapshot(g)
    d = g.edit()
    change(d)
    with pytest.raises(EditRefused, match=match):
        d.commit()
    assert snapshot(g) == before  # the original graph is unchanged
    return d


def test_edit_refuses_losing_a_witness():
    g, r = layer_graph()
    edit_and_refuse(g, lambda d: d.outputs.__delitem__(1),
                    r"lost: \[\"witness 'pre_tanh'\"\], added: \[\]")


def test_edit_refuses_relabelling_a_witness():
    g, r = layer_graph()
    def change(d):
        o = d.outputs[1]
        d.outputs[1] = GraphOutput(o.value, o.kind, label="renamed")
    edit_and_refuse(g, change, "pre_tanh")


def test_edit_refuses_losing_an_export():
    g, r = layer_graph()
    edit_and_refuse(g, lambda d: d.outputs.__delitem__(2), r"lost: \['export @stage1'\]")


def test_edit_refuses_losing_a_state_pair():
    g, r = layer_graph()
    def change(d):
        d.outputs[:] = [o for o in d.outputs if o.kind is not OutputKind.STATE_NEXT]
        d.inputs.remove(r["cache"].id)  # even with its binder gone
    edit_and_refuse(g, change, r"lost: \['state_next %3'\]")


def test_edit_refuses_changing_the_result_type():
    g, r = layer_graph()
    def change(d):
        e = d.new_eqn(O.Cast(DType.BF16), [Value(g.result())])
        d.eqns.append(e)
        d.replace_uses(g.result(), e.out)
        # replace_uses also moved the export: the rewrite is refused for the result's type
    edit_and_refuse(g, change, r"changes the result type from f32\[2,4\] to bf16\[2,4\]")
    def shape(d):
        e = d.new_eqn(O.Reduce(O.ReduceOp.Sum, 0, True), [Value(g.result())])
        d.eqns.append(e)
        d.outputs[0] = GraphOutput(e.out, OutputKind.RESULT)
    edit_and_refuse(g, shape, r"to f32\[1,4\]")


def test_edit_refuses_dropping_the_result():
    g, r = layer_graph()
    edit_and_refuse(g, lambda d: d.outputs.__delitem__(0), r"lost: \['result'\]")


def test_a_committed_graph_is_independent_of_its_draft():
    g, x, y, z = small_graph()
    d = g.edit()
    e = d.new_eqn(O.Unary(O.UnaryOp.Exp), [Value(z)])
    d.eqns.append(e)
    d.outputs.append(GraphOutput(e.out, OutputKind.WITNESS, label="late"))
    with pytest.raises(EditRefused, match=r"added: \[\"witness 'late'\"\]"):
        d.commit()
    d.outputs.pop()
    g2 = d.commit()
    before = snapshot(g2)
    d.eqns.clear()  # the draft stays a draft: changing it later changes no graph
    d.outputs.clear()
    assert snapshot(g2) == before and len(g2.eqns()) == 3 and len(g.eqns()) == 2


def test_refused_check_leaves_the_original_unchanged():
    g, x, y, z = small_graph()
    before = snapshot(g)
    d = g.edit()
    d.eqns.reverse()
    d.new_value(T((5,)))
    with pytest.raises(GraphError):
        d.commit()
    assert snapshot(g) == before


def test_edit_accepts_a_rewrite_that_keeps_outputs(rng):
    """x*w+iota recomputed as w*x+iota: commit gives a new checked graph, same numbers."""
    g, r = layer_graph()
    d = g.edit()
    i = next(i for i, e in enumerate(d.eqns) if e.op == MUL)
    e = d.eqns[i]
    swapped = d.new_eqn(MUL, e.inputs[::-1])
    d.eqns.insert(i + 1, swapped)
    d.replace_uses(e.out, swapped.out)
    del d.eqns[i]
    g2 = d.commit()
    assert g2 is not g and len(g2.eqns()) == len(g.eqns())
    assert g2.producer(swapped.out).inputs == (Value(r["w"].id), Value(r["x"].id))
    ins = {"x": rng.standard_normal((2, 4)).astype(np.float32),
           "blk.0.w": rng.standard_normal(4).astype(np.float32), "pos": np.array([3]),
           "cache": rng.standard_normal((8, 4)).astype(np.float32)}
    for a, b in zip(poot.evaluate(g, ins), poot.evaluate(g2, ins), strict=True):
        np.testing.assert_array_equal(a, b)


# -- ValueId is not an int -----------------------------------------------------------------
def test_value_id_refuses_non_ints_and_is_not_an_index():
    with pytest.raises(TypeError):
        ValueId(1.0)
    with pytest.raises(TypeError):
        ValueId(-1)
    with pytest.raises(TypeError):
        ValueId(True)
    with pytest.raises(TypeError, match="u32"):
        ValueId(2 ** 32)
    assert ValueId(2 ** 32 - 1).index == 2 ** 32 - 1
    with pytest.raises(TypeError, match="a ValueId is not an integer index"):
        [1, 2, 3][ValueId(1)]
    assert ValueId(3) == ValueId(3) and ValueId(3) != 3 and repr(ValueId(3)) == "%3"


def test_every_api_taking_a_value_id_refuses_a_bare_int():
    g, r = layer_graph()
    table = ValueTable([ValueMeta(T((2,)))])
    assert table[ValueId(0)] == ValueMeta(T((2,)))
    d = g.edit()
    calls = {
        "ValueTable[]": lambda: table[0],
        "ValueTable[]=": lambda: table.__setitem__(0, ValueMeta(T((2,)))),
        "Graph.meta": lambda: g.meta(0),
        "Graph.type_of": lambda: g.type_of(0),
        "Graph.producer": lambda: g.producer(0),
        "Graph.computed_def": lambda: g.computed_def(4),
        "GraphEdit.meta": lambda: d.meta(0),
        "GraphEdit.type_of": lambda: d.type_of(0),
        "GraphEdit.replace_uses old": lambda: d.replace_uses(5, r["h"].id),
        "GraphEdit.replace_uses new": lambda: d.replace_uses(r["h"].id, 5),
        "Value": lambda: Value(0),
        "Eqn out": lambda: Eqn(ADD, (Value(ValueId(0)), Value(ValueId(0))), 7),
        "Eqn operand": lambda: Eqn(ADD, (0, Value(ValueId(0))), ValueId(7)),
        "GraphOutput value": lambda: GraphOutput(0, OutputKind.RESULT),
        "GraphOutput input": lambda: GraphOutput(ValueId(0), OutputKind.STATE_NEXT, input=3),
        "Builder.eqn": lambda: Builder().eqn(ADD, ValueId(0), ValueId(0)),
    }
    for what, call in calls.items():
        with pytest.raises(TypeError):
            call()
            pytest.fail(f"{what} accepted an int")
    with pytest.raises(TypeError, match="must be a ValueId, not int"):
        g.meta(0)


def test_lit_typing():
    assert Lit(2, F32).value == 2.0 and isinstance(Lit(2, F32).value, float)
    assert Lit(3.0, I32).value == 3 and isinstance(Lit(3.0, I32).value, int)
    assert Lit(0xFFFFFFFF, DType.U32).type == T((), DType.U32)
    with pytest.raises(DtypeError, match="literal 0.5 is not an integer"):
        Lit(0.5, I32)
    with pytest.raises(DtypeError, match=r"literal -1 does not fit u32 \[0, 4294967295\]"):
        Lit(-1, DType.U32)
    with pytest.raises(DtypeError, match="does not fit i8"):
        Lit(128, DType.I8)
    with pytest.raises(DtypeError, match="unknown dtype 'float'"):
        Lit(1.0, "float")
