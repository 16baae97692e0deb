"""The planner: kernels, aliases, views, donation, arena reuse and refusals."""
from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import poot
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from poot import ops
from poot.backends.reference import BACKEND as REFERENCE
from poot.capability import CapabilityTable, Use
from poot.contract import Backend
from poot.dtypes import DType
from poot.errors import GraphError, UnsupportedOp
from poot.ir import ops as O
from poot.plan import ARENA, plan
from poot.plan.arena import Interval, assign_offsets
from poot.plan.show import format_plan
from poot.runtime import Executor

# the helpers beside this file (pytest's importlib mode puts no test folder on sys.path)
sys.path.insert(0, str(Path(__file__).parent))
from test_runtime_support import decoder  # noqa: E402


@pytest.fixture(scope="module")
def four_layers():
    _, step, consts = decoder(layers=4)
    return step, consts, plan(step.graph, "reference")


def test_arena_of_four_layer_decoder_is_much_smaller_than_its_buffers(four_layers):
    _, _, p = four_layers
    assert p.arena_size * 8 < p.unshared_bytes
    assert p.arena_size % 256 == 0
    text = format_plan(p)
    assert f"arena {p.arena_size} B" in text and "reuse" in text and "kernels:" in text


def test_values_alive_together_never_share_bytes(four_layers):
    _, _, p = four_layers
    placed = [(v, p.places[v], *p.intervals[v]) for v in p.intervals]
    assert all(pl.region == ARENA and pl.offset % 256 == 0 for _, pl, _, _ in placed)
    for i, (v, a, s1, e1) in enumerate(placed):
        for w, b, s2, e2 in placed[i + 1:]:
            if s1 <= e2 and s2 <= e1:  # lifetimes overlap
                assert a.offset + a.nbytes <= b.offset or b.offset + b.nbytes <= a.offset, (v, w)


def test_reshape_is_an_alias_and_transpose_a_view(four_layers):
    _, _, p = four_layers
    assert not any(isinstance(s.eqn.op, O.Reshape) for s in p.steps)
    kinds = {n.kind for n in p.notes}
    assert {"alias", "view"} <= kinds
    views = [n.out for n in p.notes if n.kind == "view"]
    assert all(v.strides is not None for v in views)
    # rope's second half: a Slice read in place, at an offset into its operand's bytes
    halves = [n for n in p.notes if n.kind == "view" and isinstance(n.eqn.op, O.Slice)
              and n.eqn.op.start > 0]
    assert halves and all(n.out.offset % 256 for n in halves)
    # a linear's W^T reaches its MatMul as a strided view of the weight buffer itself
    mm = [s for s in p.steps if isinstance(s.eqn.op, O.MatMul) and
          s.inputs[1].region.startswith("w:")]
    assert mm and all(s.inputs[1].strides is not None for s in mm)


def test_kv_writes_are_donated_in_place(four_layers):
    _, _, p = four_layers
    inplace = [s for s in p.steps if s.inplace]
    assert len(inplace) == 8 and not p.copies          # k and v of 4 layers
    for s in inplace:
        assert s.out.region.startswith("state:") and s.inputs[0].region == s.out.region


def test_state_read_after_its_update_is_copied_at_step_end():
    def fn(s, x):
        new = ops.dynamic_update_slice(s, x, ops.slot("Pos", (1,), "pos", bound=4), axis=0)
        ops.state_update(s, new)
        return ops.add(ops.reduce_sum(s, 0), ops.reduce_sum(new, 0))   # reads s after

    g = poot.trace(fn, poot.spec((4, 3), name="s", kind="state"),
                   poot.spec((1, 3), name="x"))
    p = plan(g, "reference")
    assert len(p.copies) == 1 and not any(s.inplace for s in p.steps)
    x = np.random.default_rng(0).standard_normal((1, 3)).astype(np.float32)
    ex = Executor(p, {"x": x})
    s0 = np.arange(12, dtype=np.float32).reshape(4, 3)
    ex.write_state("s", s0)
    out = ex.step({"pos": [2]})
    want, s1 = poot.evaluate(g, {"s": s0, "x": x, "pos": [2]})
    np.testing.assert_array_equal(out.result, want)
    np.testing.assert_array_equal(ex.read_state("s"), s1)


def test_consts_only_eqns_fold_at_bind_on_the_reference_backend(four_layers):
    _, _, p = four_layers
    folded = [n for n in p.notes if n.kind == "bind"]
    assert folded and all(isinstance(n.eqn.op, O.Iota) for n in folded)


def test_plan_accepts_a_compiled_result_and_a_backend():
    _, step, _ = decoder(layers=1)
    compiled = SimpleNamespace(graph=step.graph, backend=REFERENCE,
                               device=REFERENCE.default_device())
    p = plan(compiled)
    assert p.backend is REFERENCE and len(p.steps) == len(plan(step.graph, REFERENCE).steps)


class NoMatMul(Backend):
    """A backend whose table declares every op but MatMul: planning must refuse."""

    name = "no-matmul"
    language = "test"

    def probe(self):
        return REFERENCE.probe()

    def capabilities(self, device):
        table = REFERENCE.capabilities(device)
        ops_ = {k: v for k, v in table.ops.items() if k != "MatMul"}
        return CapabilityTable(self.name, device.id, {d: Use.all() for d in DType}, ops_)


def test_every_eqn_is_checked_before_anything_runs():
    _, step, _ = decoder(layers=1)
    with pytest.raises(UnsupportedOp, match="MatMul"):
        plan(step.graph, NoMatMul())


def test_a_state_swap_that_cannot_be_ordered_is_refused():
    def fn(a, b):
        ops.state_update(a, b)
        ops.state_update(b, a)
        return ops.add(a, b)

    g = poot.trace(fn, poot.spec((2,), name="a", kind="state"),
                   poot.spec((2,), name="b", kind="state"))
    with pytest.raises(GraphError, match="overwritten in the same step"):
        plan(g, "reference")


def test_compiled_graph_plans_through_definitions_and_matches_the_oracle():
    """poot.compile's composites (fused regions, attention, rope, packed contractions) run
    on the reference backend as their definitions: bit for bit the source graph's answer,
    and the packed weights decoded once at bind."""
    from poot.models.llama import build_decoder, const_inputs, random_weights, tiny_config
    from test_runtime_support import OracleStepper

    c = tiny_config(layers=1)
    w = random_weights(c, seed=9, packed_format="gguf:Q8_0")
    step = build_decoder(c, w)
    compiled = poot.compile(step.graph, "reference")
    assert any(isinstance(e.op, O.NormedPackedContraction) for e in compiled.graph.eqns())
    p = plan(compiled)
    assert not any(s.eqn.op.composite for s in p.steps)
    assert any(r.weight.representation == "f32-decoded" for r in p.weight_regions()
               if r.weight.folded)
    consts = const_inputs(step, w)
    ex = Executor(p, consts)
    oracle = OracleStepper(step.graph, consts)
    for pos, tok in enumerate([5, 17, 2]):
        slots = {"tokens": [tok], "pos": [pos]}
        np.testing.assert_array_equal(ex.step(slots).result, oracle.step(slots))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 30), st.integers(0, 8), st.integers(1, 2000)),
                min_size=1, max_size=40))
def test_arena_offsets_never_overlap_live_intervals(raw):
    ivs = [Interval(i, s, s + d, n) for i, (s, d, n) in enumerate(raw)]
    offsets, size = assign_offsets(ivs)
    for a in ivs:
        assert offsets[a.key] % 256 == 0 and offsets[a.key] + a.nbytes <= size
        for b in ivs:
            if a.key < b.key and a.start <= b.end and b.start <= a.end:
                assert (offsets[a.key] + a.nbytes <= offsets[b.key]
                        or offsets[b.key] + b.nbytes <= offsets[a.key])
    assert size <= sum(-(-iv.nbytes // 256) * 256 for iv in ivs)


def test_a_dense_f32_weight_is_bound_once_not_widened_into_a_copy():
    """DenseContraction's definition casts its weight to F32: for an f32 weight that is an
    alias, so the tied table serves its gather and the head from one buffer."""
    from poot.models.llama import build_decoder, const_inputs, random_weights, tiny_config

    c = tiny_config(layers=1)
    w = random_weights(c, seed=3)
    step = build_decoder(c, w)
    p = plan(poot.compile(step.graph, "reference"))
    assert not any(isinstance(s.eqn.op, O.Cast) for s in p.steps)
    weights = [r.weight for r in p.weight_regions()]
    assert not any(w.folded and isinstance(w.op, O.Cast) for w in weights)
    assert len([w for w in weights if not w.folded]) == len(step.graph.consts())
    ex = Executor(p, const_inputs(step, w))
    want = poot.evaluate(step.graph, {**const_inputs(step, w), "tokens": [4], "pos": [0],
                                      **{step.graph.meta(v).identity.label:
                                         np.zeros(step.graph.type_of(v).shape, np.float32)
                                         for v, _ in step.graph.state()}})
    np.testing.assert_array_equal(ex.step({"tokens": [4], "pos": [0]}).result,
                                  [a for o, a in zip(step.graph.outputs(), want, strict=True)
                                   if o.kind.value == "result"][0])
