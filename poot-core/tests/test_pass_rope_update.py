"""rope_update: the rotated keys a step writes to its dense cache become one RopeUpdateSlice;
near misses stay, with the reason; the fused kernel writes the bytes Rope then
DynamicUpdateSlice write."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import poot
import pytest
from poot.compiler.policy import Policy
from poot.compiler.validate import validated_pass
from poot.conformance.roles import input_role
from poot.dtypes import DType
from poot.ir.builder import Builder
from poot.ir.ops import Cast, DynamicUpdateSlice, Reshape, Rope, Slice, Transpose
from poot.ir.types import SlotKind, TensorType

F32, F16 = DType.F32, DType.F16
CACHE = (2, 8, 16)   # [Hkv, S, D]


def qk_graph(tokens=1, table_heads=1, read_k=False, cut=(2, 3, 5), casts=(),
             reshape_after=False):
    """A step's q (3 heads) and k (2 heads) rotated as one result [1, T, 5, 16]; k's rows
    cut from it (`cut`: the Slice's axis, start, end), made [Hkv, T, D], cast to each of
    `casts` (the last is the cache's dtype) and written to the cache at pos; q is the
    result. `table_heads`: cos and sin per head (5) or shared (1); `read_k`: the cut rows
    are also a witness; `reshape_after`: [Hkv, T, D] reshaped (to itself) after the
    Transpose."""
    b = Builder("qk", compiler=True)
    cache = b.state(TensorType(CACHE, casts[-1] if casts else F32), "k_cache")
    x = b.slot(input_role(F32), (1, tokens, 5, 16), "x")
    cos, sin = (b.slot(input_role(F32), (1, tokens, table_heads, 6), n) for n in ("cos", "sin"))
    pos = b.slot(SlotKind.POS, (1,), "pos", bound=CACHE[1] - tokens + 1)
    r = b.eqn(Rope(12), x, cos, sin)
    k = b.eqn(Slice(*cut), r)
    if read_k:
        b.witness(k, "k")
    rows = b.eqn(Transpose((1, 0, 2)), b.eqn(Reshape((tokens, 2, 16)), k))
    if reshape_after:
        rows = b.eqn(Reshape((2, tokens, 16)), rows)
    for dtype in casts:
        rows = b.eqn(Cast(dtype), rows)
    b.state_next(cache, b.eqn(DynamicUpdateSlice(1), cache, rows, pos))
    b.result(b.eqn(Slice(2, 0, 3), r))
    return b.finish()


def validated(g, seed: int):
    """rope_update alone, checked against the oracle (float slots drawn here: the validator
    draws slots as integer positions)."""
    rng = np.random.default_rng(seed)
    floats = {g.meta(v).identity.label: rng.standard_normal(g.type_of(v).shape).astype(
        np.float32) for v in g.inputs() if g.type_of(v).dtype is F32}
    return validated_pass(g, "rope_update", seed=seed, given=floats)


@pytest.mark.parametrize("casts, tokens", [((), 1), ((F16,), 1), ((), 3), ((F16,), 3)],
                         ids=["f32-cache", "f16-cache", "f32-cache-3-tokens",
                              "f16-cache-3-tokens"])
def test_rotated_keys_written_to_the_cache_become_one_rope_update_slice(casts, tokens):
    out, rec = validated(qk_graph(tokens=tokens, casts=casts), 4)
    names = [e.op.name for e in out.eqns()]
    assert rec.rewrites == 2 and names.count("RopeUpdateSlice") == 1   # and q's Rope
    assert not {"DynamicUpdateSlice", "Transpose", "Cast"} & set(names)
    # the write reads k's rows before the rotation, not after; q's are rotated alone;
    # several tokens' rows [T, Hkv, D] go to the cache head by head
    fused = next(e for e in out.eqns() if e.op.name == "RopeUpdateSlice")
    assert (fused.op.rot, fused.op.axis, fused.op.tokens_first) == (12, 1, tokens > 1)
    rows = out.producer(fused.inputs[1].id)
    assert rows.op == Slice(2, 3, 5) and out.producer(rows.inputs[0].id) is None
    (rope,) = [e for e in out.eqns() if e.op.name == "Rope"]
    assert rope.out == out.result() and out.producer(rope.inputs[0].id).op == Slice(2, 0, 3)


@pytest.mark.parametrize("kw,why", [
    (dict(read_k=True), "read elsewhere"),
    (dict(table_heads=5), "vary along the sliced axis"),
    (dict(tokens=2, reshape_after=True), "reshaped after the Transpose"),
    (dict(cut=(3, 0, 16)), "cuts the rotated features"),
    (dict(casts=(F16, F32)), "rounded more than once"),
])
def test_near_misses_stay_apart(kw, why):
    g = qk_graph(**kw) if "cut" not in kw else _feature_cut()
    out, rec = validated(g, 5)
    assert rec.rewrites == 0 and "RopeUpdateSlice" not in {e.op.name for e in out.eqns()}
    assert why in rec.decisions[0].reason


def _feature_cut():
    """k's rows cut on the feature axis (the first 16 features of each of 5 heads of 32)."""
    b = Builder("cut", compiler=True)
    cache = b.state(TensorType((5, 8, 16), F32), "k_cache")
    x = b.slot(input_role(F32), (5, 1, 32), "x")
    cos, sin = (b.slot(input_role(F32), (1, 1, 6), n) for n in ("cos", "sin"))
    pos = b.slot(SlotKind.POS, (1,), "pos", bound=8)
    r = b.eqn(Rope(12), x, cos, sin)
    b.state_next(cache, b.eqn(DynamicUpdateSlice(1), cache, b.eqn(Slice(2, 0, 16), r), pos))
    b.result(r)
    return b.finish()


def _executor(backend: str, policy: Policy, casts):
    from poot.plan import plan
    from poot.runtime.executor import Executor

    sys.path.insert(0, str(Path(__file__).parent))   # the helpers beside this file
    from test_runtime_support import backend_target

    target = backend_target(backend)
    compiled = poot.compile(qk_graph(casts=casts), target, policy=policy)
    return Executor(plan(compiled, target), {}), compiled


# wgpu has no f16 select (Rope's kernels select in the cache's dtype): it refuses that one
@pytest.mark.parametrize("backend,casts", [("cpu", ()), ("vulkan", ()), ("wgpu", ()),
                                           ("cpu", (F16,)), ("vulkan", (F16,))],
                         ids=["cpu", "vulkan", "wgpu", "cpu-f16-cache", "vulkan-f16-cache"])
def test_the_fused_write_is_bit_identical_to_rope_then_update(backend, casts):
    rng = np.random.default_rng(11)
    cache = rng.standard_normal(CACHE).astype(casts[-1].numpy if casts else np.float32)
    slots = {"x": rng.standard_normal((1, 1, 5, 16)).astype(np.float32),
             "cos": rng.standard_normal((1, 1, 1, 6)).astype(np.float32),
             "sin": rng.standard_normal((1, 1, 1, 6)).astype(np.float32),
             "pos": np.array([5], np.int32)}
    got = {}
    for name, policy in (("fused", Policy(fuse={"RopeUpdateSlice"})),
                         ("apart", Policy(disable={"rope_update"}))):
        ex, compiled = _executor(backend, policy, casts)
        ops = {e.op.name for e in compiled.graph.eqns()}
        assert ("RopeUpdateSlice" in ops) == (name == "fused"), ops
        ex.write_state("k_cache", cache)
        q = ex.step(slots).result.copy()
        got[name] = (q, ex.read_state("k_cache").copy())
    (q, kc), (q0, kc0) = got["fused"], got["apart"]
    assert q.tobytes() == q0.tobytes() and kc.tobytes() == kc0.tobytes()
    assert not np.array_equal(kc, cache)          # the rows at pos were written
    assert np.array_equal(np.delete(kc, 5, axis=1), np.delete(cache, 5, axis=1))
