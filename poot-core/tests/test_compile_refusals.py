"""What compile refuses: rewrites that lose an output (driven by deliberately broken
passes into GraphEdit.commit's refusal), and collectives inside a stage graph."""
from __future__ import annotations

import poot
import pytest
from poot import ops
from poot.compiler import pipeline
from poot.compiler.rewrite import Rewriter
from poot.errors import EditRefused, GraphError, UnsupportedOp
from poot.ir.builder import Builder
from poot.ir.graph import OutputKind
from poot.ir.ops import AllGather, AllReduce
from poot.ir.types import TensorType


def stage():
    def fn(x, cache):
        y = ops.exp(x)
        ops.witness(ops.neg(y), "neg")
        ops.export(ops.mul(y, 2.0), "to_stage_1")
        ops.state_update(cache, ops.add(cache, y))
        return ops.add(y, 1.0)

    return poot.trace(fn, poot.spec((4,)), poot.spec((4,), kind="state", name="cache"))


def drop_outputs(kind):
    """A broken dead-code pass: treats `kind` outputs as dead, and drops them."""
    def run(graph, ctx):
        rw = Rewriter(graph)
        rw.draft.outputs[:] = [o for o in graph.outputs() if o.kind is not kind]
        return rw.draft.commit()
    return run


def retype_result(graph, ctx):
    """A broken pass: rewrites the result into another dtype."""
    rw = Rewriter(graph)
    cast = rw.draft.new_eqn(poot.ir.Cast("bf16"), [poot.ir.Value(graph.result())])
    rw.draft.eqns.append(cast)
    rw.draft.outputs[:] = [o if o.kind is not OutputKind.RESULT else
                           poot.ir.GraphOutput(cast.out, o.kind) for o in graph.outputs()]
    return rw.draft.commit()


@pytest.mark.parametrize("broken,lost", [
    (drop_outputs(OutputKind.WITNESS), "witness 'neg'"),
    (drop_outputs(OutputKind.EXPORT), "export @to_stage_1"),
    (drop_outputs(OutputKind.STATE_NEXT), "state_next"),
    (retype_result, "result type"),
])
def test_broken_pass_is_refused_by_commit(monkeypatch, broken, lost):
    g = stage()
    monkeypatch.setattr(pipeline, "PASSES", [("broken", broken)] + pipeline.PASSES)
    with pytest.raises(EditRefused, match=lost.replace("(", r"\(")):
        poot.compile(g, "reference")


def test_removing_a_state_producer_is_refused():
    """A pass that deletes the eqn behind a state pair leaves an output naming nothing."""
    g = stage()

    def broken(graph, ctx):
        rw = Rewriter(graph)
        (_, nxt), = graph.state()
        rw.remove(graph.producer(nxt))
        return rw.commit()

    with pytest.raises(GraphError, match="undefined value"):
        broken(g, None)


def test_real_pipeline_keeps_every_output():
    g = stage()
    out = poot.compile(g, "reference").graph
    assert [o.key() for o in out.outputs()] == [o.key() for o in g.outputs()]


@pytest.mark.parametrize("collective", [AllReduce(2), AllGather(2, 0), AllReduce(1)])
def test_collective_inside_a_stage_is_refused(collective):
    b = Builder("tp_stage", compiler=True)
    x = b.const(TensorType((4, 3), "f32"), "x")
    b.result(b.eqn(collective, b.eqn(poot.ir.Unary(poot.ir.UnaryOp.Exp), x)))
    with pytest.raises(UnsupportedOp, match="cut between stages"):
        poot.compile(b.finish(), "reference")
