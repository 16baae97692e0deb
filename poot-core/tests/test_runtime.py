"""The executor on the reference backend against the oracle, step by step."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import poot
import pytest
from poot import ops
from poot.contract import Executable, Runtime
from poot.errors import BindError, SlotRangeError
from poot.formats import PackedWeight, get_format
from poot.plan import plan
from poot.runtime import Executor, WeightCache

# the helpers beside this file (pytest's importlib mode puts no test folder on sys.path)
sys.path.insert(0, str(Path(__file__).parent))
from test_runtime_support import OracleStepper, decoder  # noqa: E402


def test_dense_decode_matches_the_oracle_bit_for_bit():
    c, step, consts = decoder(layers=2, kv="dense")
    ex = Executor(plan(step.graph, "reference"), consts)
    assert isinstance(ex.runtime, Runtime) and isinstance(ex.executable, Executable)
    tokens = np.random.default_rng(1).integers(0, c.vocab, 6)
    _same_as_oracle(ex, OracleStepper(step.graph, consts),
                    [{"tokens": [tok], "pos": [pos]} for pos, tok in enumerate(tokens)])


def test_paged_decode_matches_the_oracle_bit_for_bit():
    c, step, consts = decoder(layers=2, kv="paged", batch=2, pool_slots=48)
    ex = Executor(plan(step.graph, "reference"), consts)
    rng = np.random.default_rng(2)
    # two sequences: rows 0 and 1 take pool slots from two shuffled halves of the pool
    slots_of = rng.permutation(48).reshape(2, 24).astype(np.int32)
    smap = np.zeros((2, c.max_seq), np.int32)
    smap[:, :24] = slots_of
    _same_as_oracle(ex, OracleStepper(step.graph, consts),
                    [{"tokens": rng.integers(0, c.vocab, (2, 1)), "pos": [[pos], [pos]],
                      "write_map": slots_of[:, pos], "slot_map": smap} for pos in range(5)])


def _same_as_oracle(ex, oracle, steps) -> None:
    """Every step's result and the final state, bit for bit."""
    for slots in steps:
        np.testing.assert_array_equal(ex.step(slots).result, oracle.step(slots))
    for name, want in oracle.state.items():
        np.testing.assert_array_equal(ex.read_state(name), want)


def test_out_of_range_slot_is_refused_and_changes_nothing():
    c, step, consts = decoder(layers=1, kv="paged", batch=1, pool_slots=32)
    ex = Executor(plan(step.graph, "reference"), consts)
    good = {"tokens": [[3]], "pos": [[0]], "write_map": [5],
            "slot_map": np.full((1, c.max_seq), 5, np.int32)}
    ex.step(good)
    before = {n: ex.read_state(n) for n in ex.state_names()}
    arena = ex.read(ex.plan.outputs[0][1])
    bad_cases = [{**good, "write_map": [32]},                       # past the pool
                 {**good, "slot_map": np.full((1, c.max_seq), -1, np.int32)},
                 {**good, "tokens": [[c.vocab]]},
                 {**good, "pos": [[c.max_seq]]}]
    for bad in bad_cases:
        with pytest.raises(SlotRangeError):
            ex.step(bad)
    with pytest.raises(BindError, match="not given"):
        ex.step({k: v for k, v in good.items() if k != "pos"})
    for n, want in before.items():
        np.testing.assert_array_equal(ex.read_state(n), want)
    np.testing.assert_array_equal(ex.read(ex.plan.outputs[0][1]), arena)
    ex.step({**good, "write_map": [-1]})                             # -1: write nothing


def _two_weight_graph():
    """rows `tok` of a, times b, plus rows `tok` of b: a and b are the graph's weights."""
    return poot.trace(lambda tok, a, b: ops.add(ops.matmul(ops.gather(a, tok), b),
                                                ops.gather(b, tok)),
                      poot.spec((2,), "i32", name="tok", kind="slot", slot="Token", bound=4),
                      poot.spec((4, 4), name="a"), poot.spec((4, 4), name="b"))


def test_weight_cache_uploads_identical_bytes_once_and_different_bytes_twice():
    g = _two_weight_graph()
    p = plan(g, "reference")
    rng = np.random.default_rng(3)
    a, b = (rng.standard_normal((4, 4)).astype(np.float32) for _ in range(2))
    same = Executor(p, {"a": a, "b": a.copy()})
    assert same.weights.uploads == 1
    assert same.buffers["w:a"] is same.buffers["w:b"]
    differ = Executor(p, {"a": a, "b": b})
    assert differ.weights.uploads == 2
    assert differ.buffers["w:a"] is not differ.buffers["w:b"]
    want = poot.evaluate(g, {"tok": [3, 1], "a": a, "b": b})[0]
    np.testing.assert_array_equal(differ.step({"tok": [3, 1]}).result, want)
    # a second executor handed the cache binds nothing new; new bytes still upload
    again = Executor(p, {"a": a, "b": b}, weights=differ.weights)
    assert again.weights.uploads == 2 and again.weights.hits == 2
    b2 = b.copy()
    b2[0, 0] += 1
    Executor(p, {"a": a, "b": b2}, weights=differ.weights)
    assert differ.weights.uploads == 3


def test_weight_refs_share_one_upload_across_prefill_and_decode_plans():
    _, decode, consts = decoder(layers=2, kv="dense")
    _, prefill, _ = decoder(layers=2, kv="dense", tokens=4)
    first = Executor(plan(prefill.graph, "reference"), consts)
    n = first.weights.uploads
    second = Executor(plan(decode.graph, "reference"), consts, weights=first.weights,
                      state=first.state)
    assert second.weights.uploads == n + 1      # only the decode plan's own Iota table
    assert all(second.buffers[r] is first.buffers[r] for r in second.buffers
               if r.startswith(("w:blk", "state:")))


def test_steps_allocate_nothing():
    c, step, consts = decoder(layers=2)
    ex = Executor(plan(step.graph, "reference"), consts)
    allocs = ex.runtime.allocs
    for pos in range(4):
        ex.step({"tokens": [pos + 1], "pos": [pos]})
    assert ex.runtime.allocs == allocs


def test_packed_weight_decodes_once_at_bind(monkeypatch):
    fmt = get_format("dense:f16words")
    w = PackedWeight(fmt.name, (8, 6))
    rng = np.random.default_rng(4)
    (words,) = fmt.quantize(rng.standard_normal((8, 6)).astype(np.float32))
    g = poot.trace(lambda tok, x: ops.linear(ops.gather(x, tok),
                                             ops.packed_const(w, ["w.words"])),
                   poot.spec((3,), "i32", name="tok", kind="slot", slot="Token", bound=3),
                   poot.spec((3, 6), name="x"))
    calls = []
    real = type(fmt).dequantize
    monkeypatch.setattr(type(fmt), "dequantize",
                        lambda self, *a, **k: calls.append(1) or real(self, *a, **k))
    p = plan(g, "reference")
    assert any(r.weight.representation == "f32-decoded" for r in p.weight_regions()
               if r.weight.folded)
    x = rng.standard_normal((3, 6)).astype(np.float32)
    ex = Executor(p, {"x": x, "w.words": words})
    assert len(calls) == 1
    for _ in range(3):
        out = ex.step({"tok": [2, 0, 1]}).result
    assert len(calls) == 1
    # the same payload bound by another executor on the cache: no decode, no upload
    uploads = ex.weights.uploads
    Executor(p, {"x": x, "w.words": words}, weights=ex.weights)
    assert len(calls) == 1 and ex.weights.uploads == uploads
    assert "w:w.words" not in p.regions            # the packed source is never uploaded
    want = poot.evaluate(g, {"tok": [2, 0, 1], "x": x, "w.words": words})[0]
    np.testing.assert_array_equal(out, want)


def test_missing_const_and_bad_slot_shape_are_bind_errors():
    g = _two_weight_graph()
    p = plan(g, "reference")
    with pytest.raises(BindError, match="const b"):
        Executor(p, {"a": np.ones((4, 4), np.float32)})
    _, step, consts = decoder(layers=1)
    ex = Executor(plan(step.graph, "reference"), consts)
    with pytest.raises(BindError, match="shape"):
        ex.step({"tokens": [1, 2], "pos": [0]})
    with pytest.raises(BindError, match="no slot"):
        ex.step({"tokens": [1], "pos": [0], "typo": [0]})


def test_weight_cache_keys_on_device():
    g = _two_weight_graph()
    p = plan(g, "reference")
    cache = WeightCache(p.backend.runtime(p.device))
    assert cache.device.startswith("reference:0")


def test_a_kept_weight_copy_follows_host_writes():
    """A decode step's C-contiguous copies of its transposed weights are kept with their
    buffers; a host write of a weight (an expert pool swapping rows in) is seen by the
    next step, and writing the bytes back gives the first result bit for bit."""
    c, step, consts = decoder(layers=1, kv="dense")
    ex = Executor(plan(step.graph, "reference"), consts)
    slots = {"tokens": [3], "pos": [0]}
    first = ex.step(slots).result
    kept = [b for b in ex.buffers.values() if getattr(b, "copies", None)]
    assert kept, "a decode step keeps its strided weights' copies"
    for buf in kept:
        saved = ex.runtime.read(buf, 0, buf.nbytes)
        ex.runtime.write(buf, 0, np.zeros(buf.nbytes, np.uint8))
        assert not np.array_equal(ex.step(slots).result, first), buf.label
        ex.runtime.write(buf, 0, saved)
        np.testing.assert_array_equal(ex.step(slots).result, first)
