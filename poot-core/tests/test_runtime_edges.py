"""Executor corner cases against the oracle: views and aliases as outputs, state passed
through or copied, in-place scatter with repeated slots, a clamped update index."""
from __future__ import annotations

import numpy as np
import poot
import pytest
from poot import ops
from poot.plan import plan
from poot.runtime import Executor

RNG = np.random.default_rng(11)


def _f32(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def _check(graph, consts: dict, steps: list[dict], state: dict | None = None):
    """Run `steps` through plan + executor and through the oracle with state threaded."""
    ex = Executor(plan(graph, "reference"), consts)
    state = dict(state or {})
    for name, value in state.items():
        ex.write_state(name, value)
    for slots in steps:
        got = ex.step(slots)
        want = poot.evaluate(graph, {**consts, **state, **slots})
        outs = graph.outputs()
        for o, w in zip(outs, want, strict=True):
            if o.kind.value == "state_next":
                state[graph.meta(o.input).identity.label] = w
            elif o.kind.value == "result":
                np.testing.assert_array_equal(got.result, w)
            else:
                np.testing.assert_array_equal(got.witnesses[o.label], w)
    for name, value in state.items():
        np.testing.assert_array_equal(ex.read_state(name), value)
    return ex


def test_views_feeding_reshapes_and_outputs_are_materialized():
    def fn(tok, table, w):
        x = ops.gather(table, tok)                          # [4, 6]
        t = ops.transpose(ops.reshape(x, (2, 2, 6)), (2, 0, 1))
        ops.witness(t, "transposed")                         # an output: needs its own bytes
        flat = ops.reshape(ops.transpose(x, (1, 0)), (24,))  # a view cannot alias a reshape
        first = ops.slice_axis(ops.reshape(flat, (6, 4)), 1, 0, 1)
        return ops.add(ops.matmul(ops.transpose(x, (1, 0)), w), first)

    g = poot.trace(fn, poot.spec((4,), "i32", name="tok", kind="slot", slot="Token", bound=5),
                   poot.spec((5, 6), name="table"), poot.spec((4, 3), name="w"))
    p = plan(g, "reference")
    kinds = {n.kind for n in p.notes}
    assert "view" in kinds and "alias" in kinds
    _check(g, {"table": _f32(5, 6), "w": _f32(4, 3)},
           [{"tok": [0, 4, 2, 2]}, {"tok": [1, 1, 3, 0]}])


def test_slot_alias_as_result_and_state_passed_through():
    def fn(tok, s):
        ops.state_update(s, s)                               # unchanged state: no copy
        return ops.reshape(tok, (2, 2))

    g = poot.trace(fn, poot.spec((4,), "i32", name="tok", kind="slot", slot="Token", bound=9),
                   poot.spec((3,), name="s", kind="state"))
    p = plan(g, "reference")
    assert not p.copies and not p.steps
    _check(g, {}, [{"tok": [1, 2, 3, 4]}], {"s": _f32(3)})


def test_state_computed_elsewhere_is_copied_in_at_step_end():
    def fn(pos, s):
        nxt = ops.add(ops.mul(s, 0.5), ops.cast(pos, "f32"))
        ops.state_update(s, nxt)
        return ops.reduce_sum(s, 0)                          # reads the old state

    g = poot.trace(fn, poot.spec((1,), "i32", name="pos", kind="slot", slot="Pos", bound=100),
                   poot.spec((5,), name="s", kind="state"))
    assert len(plan(g, "reference").copies) == 1
    _check(g, {}, [{"pos": [p]} for p in (3, 7, 11)], {"s": _f32(5)})


@pytest.mark.parametrize("write_map", [[2, 2, 5], [-1, 7, -1], [6, 0, 6]])
def test_in_place_scatter_matches_the_oracle_with_repeats_and_skips(write_map):
    def fn(tok, wmap, table, pool):
        new = ops.scatter_update(pool, ops.gather(table, tok), wmap)
        ops.state_update(pool, new)
        return ops.reduce_sum(new, 0)

    g = poot.trace(fn, poot.spec((3,), "i32", name="tok", kind="slot", slot="Token", bound=4),
                   poot.spec((3,), "i32", name="wmap", kind="slot", slot="WriteMap", bound=8),
                   poot.spec((4, 2), name="table"), poot.spec((8, 2), name="pool",
                                                             kind="state"))
    assert any(s.inplace for s in plan(g, "reference").steps)
    _check(g, {"table": _f32(4, 2)}, [{"tok": [0, 1, 3], "wmap": write_map},
                                      {"tok": [2, 2, 1], "wmap": [1, 3, 4]}], {"pool": _f32(8, 2)})


def test_in_place_dynamic_update_clamps_like_the_oracle():
    def fn(tok, pos, table, cache):
        upd = ops.reshape(ops.gather(table, tok), (1, 2, 3))
        new = ops.dynamic_update_slice(cache, upd, pos, axis=1)
        ops.state_update(cache, new)
        return ops.reduce_sum(new, 1)

    g = poot.trace(fn, poot.spec((2,), "i32", name="tok", kind="slot", slot="Token", bound=3),
                   poot.spec((1,), "i32", name="pos", kind="slot", slot="Pos", bound=7),
                   poot.spec((3, 3), name="table"), poot.spec((1, 6, 3), name="cache",
                                                              kind="state"))
    # pos 5 and 6 lie in the slot's range but past the last full write: clamped to 4
    _check(g, {"table": _f32(3, 3)}, [{"tok": [0, 2], "pos": [p]} for p in (0, 5, 6, 2)],
           {"cache": _f32(1, 6, 3)})


def test_consts_sharing_a_name_must_be_bound_by_value_id():
    from poot.errors import BindError, GraphError

    def fn(tok, a, b):
        return ops.add(ops.gather(a, tok), ops.gather(b, tok))

    g = poot.trace(fn, poot.spec((2,), "i32", name="tok", kind="slot", slot="Token", bound=3),
                   poot.spec((3, 2), name="w"), poot.spec((3, 2), name="w"))
    p = plan(g, "reference")
    a, b = _f32(3, 2), _f32(3, 2)
    with pytest.raises(BindError, match="several consts named 'w'"):
        Executor(p, {"w": a})
    first, second = g.consts()
    ex = Executor(p, {first: a, second: b})
    want = poot.evaluate(g, {"tok": [2, 0], first: a, second: b})[0]
    np.testing.assert_array_equal(ex.step({"tok": [2, 0]}).result, want)
    def both(s, t):
        ops.state_update(s, ops.add(s, t))
        ops.state_update(t, t)
        return ops.add(s, t)

    twin = poot.trace(both, poot.spec((2,), name="s", kind="state"),
                      poot.spec((2,), name="s", kind="state"))
    with pytest.raises(GraphError, match="two state binders"):
        plan(twin, "reference")
