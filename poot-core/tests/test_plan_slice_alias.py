"""A Slice that is one contiguous run of its operand's bytes is a free alias at an offset
(no copy kernel on any backend); other slices, slices that are outputs and slices at
offsets a storage binding cannot start at stay copies (or strided views)."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import poot
import pytest
from poot import ops
from poot.conformance.roles import input_role
from poot.dtypes import DType
from poot.ir import ops as O
from poot.plan import ARENA, plan
from poot.plan.show import format_plan
from poot.runtime.executor import Executor

# the helpers beside this file (pytest's importlib mode puts no test folder on sys.path)
sys.path.insert(0, str(Path(__file__).parent))
from test_runtime_support import backend_target  # noqa: E402

BACKENDS = ["reference", "cpu", "vulkan", "wgpu", "cuda", "rocm"]
#: backends whose kernels read contiguous operands only: a slice there is an alias or a copy
CONTIGUOUS = BACKENDS[1:]


def _x(shape):
    return poot.spec(shape, name="x", kind="slot", slot=input_role(DType.F32))


def _run(g, target, inputs: dict, consts: dict | None = None):
    """The plan, after checking every output of one step against the oracle."""
    p = plan(g, target)
    got = Executor(p, consts or {}).step(inputs)
    want = poot.evaluate(g, {**inputs, **(consts or {})})
    for o, w in zip(g.outputs(), want, strict=True):
        mine = got.result if o.kind.value == "result" else got.witnesses[o.label]
        np.testing.assert_allclose(mine, w, rtol=1e-6, atol=1e-6)
    return p


def _slices(p, kind=None):
    return [n for n in p.notes if isinstance(n.eqn.op, O.Slice) and kind in (None, n.kind)]


def _copies(p):
    return [s for s in p.steps if isinstance(s.eqn.op, O.Slice)]


@pytest.mark.parametrize("backend", BACKENDS)
def test_head_slices_of_a_row_are_aliases_at_offsets(backend, rng):
    def fn(x):
        h = ops.reshape(x, (1, 48, 8))
        a, b, c = (ops.slice_axis(h, 1, k, k + 16) for k in (0, 16, 32))
        ops.witness(ops.exp(a), "a")
        flat = ops.reshape(b, (16, 8))                  # an alias of an alias, offset kept
        ops.witness(ops.mul(flat, flat), "b")
        return ops.reduce_sum(c, 2)

    g = poot.trace(fn, _x((1, 48 * 8)))
    p = _run(g, backend_target(backend), {"x": rng.standard_normal((1, 384)).astype(np.float32)})
    assert not _copies(p)
    notes = _slices(p)
    assert [n.kind for n in notes] == ["alias"] * 3
    # 16 rows of 8 f32 apart, in the slot's own buffer, with no strides
    assert [(n.out.region, n.out.offset, n.out.strides) for n in notes] == \
        [("slot:x", 0, None), ("slot:x", 512, None), ("slot:x", 1024, None)]
    mul = next(s for s in p.steps if isinstance(s.eqn.op, O.Binary))
    assert mul.inputs[0].offset == 512 and mul.inputs[0].contiguous
    assert "alias Slice{axis=1, start=32, end=48} f32[1,16,8]@slot:x+1024" in format_plan(p)


@pytest.mark.parametrize("backend", CONTIGUOUS)
@pytest.mark.parametrize("shape, start, end", [((2, 48, 8), 16, 32),    # rows of two batches
                                               ((1, 48, 8), 3, 7)])     # at byte 96
def test_other_slices_are_still_copied(backend, shape, start, end, rng):
    g = poot.trace(lambda x: ops.exp(ops.slice_axis(x, 1, start, end)), _x(shape))
    p = _run(g, backend_target(backend), {"x": rng.standard_normal(shape).astype(np.float32)})
    assert len(_copies(p)) == 1 and not _slices(p)
    assert all(pl.region != ARENA or pl.offset % 256 == 0 for pl in p.places.values())


@pytest.mark.parametrize("backend", ["reference", "cpu"])
def test_a_slice_that_is_an_output_has_bytes_of_its_own(backend, rng):
    def fn(x):
        h = ops.reshape(x, (4, 64))
        ops.witness(ops.slice_axis(h, 0, 0, 1), "first")
        return ops.reshape(ops.slice_axis(h, 0, 2, 4), (128,))   # an output through an alias

    g = poot.trace(fn, _x((256,)))
    p = _run(g, backend_target(backend), {"x": rng.standard_normal(256).astype(np.float32)})
    assert len(_copies(p)) == 2 and not _slices(p)
    assert all(pl.region == ARENA for _, pl in p.outputs)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_slice_of_a_weight_reads_its_rows_in_the_weight_buffer(backend, rng):
    def fn(x, w):
        rows = ops.reshape(ops.slice_axis(w, 0, 32, 48), (1, 16, 8))
        return ops.mul(ops.slice_axis(ops.reshape(x, (1, 48, 8)), 1, 16, 32), rows)

    g = poot.trace(fn, _x((1, 384)), poot.spec((48, 8), name="w"))
    w = rng.standard_normal((48, 8)).astype(np.float32)
    p = _run(g, backend_target(backend), {"x": rng.standard_normal((1, 384)).astype(np.float32)},
             {"w": w})
    (mul,) = p.steps
    assert [(x.region, x.offset) for x in mul.inputs] == [("slot:x", 512), ("w:w", 1024)]
    assert [r.nbytes for r in p.weight_regions()] == [w.nbytes]   # bound once, whole


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_update_reading_its_own_state_is_not_done_in_place(backend, rng):
    """rows 1..2 of the state written at row `pos`: the update's operand lies in the bytes
    it overwrites, so the update goes to a fresh buffer and is copied in at the end."""
    def fn(s):
        pos = ops.slot("Pos", (1,), "pos", bound=3)
        new = ops.dynamic_update_slice(s, ops.slice_axis(s, 0, 1, 3), pos, axis=0)
        ops.state_update(s, new)
        return ops.reduce_sum(new, 1)

    g = poot.trace(fn, poot.spec((4, 64), name="s", kind="state"))
    p = plan(g, backend_target(backend))
    assert [n.out.region for n in _slices(p, "alias")] == ["state:s"]
    assert not any(s.inplace for s in p.steps) and len(p.copies) == 1
    ex = Executor(p, {})
    s = rng.standard_normal((4, 64)).astype(np.float32)
    ex.write_state("s", s)
    for pos in (0, 2):
        want, s = poot.evaluate(g, {"s": s, "pos": [pos]})
        np.testing.assert_allclose(ex.step({"pos": [pos]}).result, want, rtol=1e-6)
        np.testing.assert_array_equal(ex.read_state("s"), s)      # moved, not computed
