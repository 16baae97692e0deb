"""kv_write: a step's value rows [T, Hkv, D], transposed into the dense cache's order and
written at pos, become one TransposedUpdateSlice (the oracle agrees); near misses stay,
with the reason."""
from __future__ import annotations

import numpy as np
import pytest
from poot.compiler.validate import validated_pass
from poot.conformance.roles import input_role
from poot.dtypes import DType
from poot.ir.builder import Builder
from poot.ir.ops import Cast, DynamicUpdateSlice, Reshape, Transpose
from poot.ir.types import SlotKind, TensorType

F32, F16 = DType.F32, DType.F16
CACHE = (2, 8, 16)   # [Hkv, S, D]


def v_graph(tokens=3, casts=(), read_rows=False, perm=(1, 0, 2)):
    """A step's values [1, T, 2, 16] made [Hkv, T, D] (`perm` of [T, Hkv, D]), cast to each
    of `casts` (the last is the cache's dtype), written to the cache at pos; `read_rows`:
    the transposed rows are also a witness."""
    b = Builder("v", compiler=True)
    cache = b.state(TensorType(CACHE, casts[-1] if casts else F32), "v_cache")
    v = b.slot(input_role(F32), (1, tokens, 2, 16), "v")
    pos = b.slot(SlotKind.POS, (1,), "pos", bound=CACHE[1] - tokens + 1)
    rows = b.eqn(Transpose(perm), b.eqn(Reshape((tokens, 2, 16)), v))
    if read_rows:
        b.witness(rows, "rows")
    for dtype in casts:
        rows = b.eqn(Cast(dtype), rows)
    b.state_next(cache, b.eqn(DynamicUpdateSlice(1), cache, rows, pos))
    b.result(v)
    return b.finish()


def validated(g, seed: int):
    rng = np.random.default_rng(seed)
    floats = {g.meta(x).identity.label: rng.standard_normal(g.type_of(x).shape).astype(
        np.float32) for x in g.inputs() if g.type_of(x).dtype is F32}
    return validated_pass(g, "kv_write", seed=seed, given=floats)


@pytest.mark.parametrize("casts", [(), (F16,)], ids=["f32-cache", "f16-cache"])
def test_transposed_rows_written_to_the_cache_become_one_write(casts):
    out, rec = validated(v_graph(casts=casts), 4)
    names = [e.op.name for e in out.eqns()]
    assert rec.rewrites == 1 and names.count("TransposedUpdateSlice") == 1
    assert not {"DynamicUpdateSlice", "Transpose", "Cast"} & set(names)
    (write,) = [e for e in out.eqns() if e.op.name == "TransposedUpdateSlice"]
    assert write.op.axis == 1 and out.type_of(write.inputs[1].id).shape == (3, 2, 16)


@pytest.mark.parametrize("kw,why", [
    (dict(tokens=1), "moves only unit axes"),
    (dict(read_rows=True), "read elsewhere"),
    (dict(casts=(F16, F32)), "is Cast, not Transpose"),   # rounded twice
])
def test_near_misses_stay_apart(kw, why):
    out, rec = validated(v_graph(**kw), 5)
    assert rec.rewrites == 0 and "TransposedUpdateSlice" not in {e.op.name for e in out.eqns()}
    assert why in rec.decisions[0].reason
