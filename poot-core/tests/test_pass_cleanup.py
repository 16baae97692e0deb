"""Clean-up passes: dead-code elimination, Iota folding, unit-axis Transposes as Reshapes."""
from __future__ import annotations

from collections import Counter

import poot
from poot import ops
from poot.compiler import run_pass
from poot.compiler.validate import validated_pass
from poot.ir.types import SlotKind, StorageClass


def test_dead_eqns_go_and_the_interface_stays():
    def fn(x, unused, pos):
        ops.exp(ops.mul(x, 2.0))                          # dead
        return ops.add(x, 1.0)

    g = poot.trace(fn, poot.spec((3,)), poot.spec((2,), name="unused"),
                   poot.spec((1,), "i32", kind="slot", slot=SlotKind.POS, bound=4))
    out, rec = validated_pass(g, "dce")
    assert [e.op.name for e in out.eqns()] == ["Binary"]
    assert out.inputs() == g.inputs() and rec.rewrites == 2


def test_witnesses_and_state_keep_their_producers():
    def fn(x, s):
        ops.witness(ops.neg(x), "neg")
        ops.state_update(s, ops.add(s, 1.0))
        return ops.exp(x)

    g = poot.trace(fn, poot.spec((3,)), poot.spec((3,), kind="state", name="s"))
    out, rec = validated_pass(g, "dce")
    assert out is g and rec.rewrites == 0


def iota_graph():
    def fn(pos):
        a = ops.add(ops.iota((4,), 0), pos)                       # I32 range
        b = ops.add(ops.iota((4,), 0), ops.iota((4,), 0))         # the same range twice
        f = ops.mul(ops.iota((2, 4), 1, "f32"), 0.5)              # F32 range
        return ops.add(ops.cast(ops.add(a, b), "f32"), f)

    return poot.trace(fn, poot.spec((1,), "i32", kind="slot", slot=SlotKind.POS, bound=9))


def test_iota_folding():
    g = iota_graph()
    out, rec = validated_pass(g, "iota_fold")
    assert "Iota" not in {e.op.name for e in out.eqns()}
    computed = out.computed()
    assert len(computed) == 2                                      # shared I32 range, F32 range
    assert Counter(str(out.computed_def(v).dtype) for v in computed) == Counter(
        {"i32": 1, "f32": 1})
    assert all(out.meta(v).storage.cls is StorageClass.COMPUTED for v in computed)
    assert rec.rewrites == 4


def test_unused_computed_binder_is_dropped_by_dce():
    g, _ = run_pass(iota_graph(), "iota_fold", "reference")
    edit = g.edit()
    # make one computed range dead: readers of the F32 range read a fresh Iota instead
    (f32_range,) = [v for v in g.computed() if str(g.computed_def(v).dtype) == "f32"]
    fresh = edit.new_eqn(g.computed_def(f32_range), [])
    edit.eqns.insert(0, fresh)
    edit.replace_uses(f32_range, fresh.out)
    g2 = edit.commit()
    out, rec = validated_pass(g2, "dce")
    assert f32_range not in out.inputs() and len(out.computed()) == 1


def test_f32_range_past_exact_floats_is_not_folded():
    g = poot.trace(lambda: ops.reduce_sum(ops.iota((2 ** 24 + 2,), 0, "f32")))
    out, rec = run_pass(g, "iota_fold", "reference")
    assert out is g and "not exact past 2**24" in rec.decisions[0].reason


def test_transposes_of_unit_axes_become_reshapes():
    def fn(q, k):
        a = ops.transpose(q, (0, 2, 1, 3))        # [1, 1, 9, 8] -> [1, 9, 1, 8]: a relabel
        b = ops.transpose(k, (0, 2, 1, 3))        # [1, 2, 3, 8] -> [1, 3, 2, 8]: moves data
        first = ops.slice_axis(ops.reshape(ops.exp(b), (6, 8)), 0, 0, 1)
        return ops.add(ops.reshape(ops.exp(a), (9, 8)), first)

    g = poot.trace(fn, poot.spec((1, 1, 9, 8)), poot.spec((1, 2, 3, 8)))
    out, rec = validated_pass(g, "relabel")
    names = Counter(e.op.name for e in out.eqns())
    assert names["Transpose"] == 1 and names["Reshape"] == 3
    assert rec.rewrites == 1
