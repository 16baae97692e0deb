"""The ring GEMV (packed weights copied 16 bytes a time into each lane's own shared ring,
activations resident): chosen where the target copies asynchronously into a large shared
memory, and equal to the numpy decode through the kernel interpreter."""
from __future__ import annotations

import numpy as np
import pytest
from poot.codegen.interp import run_lowering
from poot.codegen.lower import dot, lower
from poot.codegen.program import Barrier, CoopReduce, CopyAsync
from poot.codegen.target import COPY_ASYNC, FEATURES, LARGE_SHARED
from poot.dtypes import DType
from poot.formats import PackedWeight, get_format
from poot.ir.ops import PackedContraction
from poot.ir.types import TensorType as T

RING = frozenset({COPY_ASYNC, LARGE_SHARED})


def _lowered(fmt: str, m: int, n: int, k: int, features):
    pw = PackedWeight(fmt, (n, k))
    ins = [T((m, k), DType.F32), *[s.type for s in pw.sources()]]
    op = PackedContraction(pw)
    out = op.infer(ins)
    return pw, ins, out, lower(op, ins, out, features)


@pytest.mark.parametrize("fmt, m, n, k, lanes", [
    ("gguf:Q4_0", 1, 24, 3072, 4),    # 12 units: 3 trips per lane, the ring wraps
    ("gguf:Q4_K", 3, 10, 2048, 8),    # 3 rows share each weight; spare columns
    ("gguf:Q4_1", 1, 8, 512, 4),      # 128-element units of 20 words (padded to 24)
])
def test_ring_gemv_matches_numpy(fmt, m, n, k, lanes):
    pw, ins, out, prog = _lowered(fmt, m, n, k, FEATURES)
    (kernel,) = prog.kernels
    body = list(kernel.statements())
    assert any(isinstance(s, CopyAsync) for s in body)
    assert sum(isinstance(s, Barrier) for s in body) == 1      # none in the K loop
    assert {s.width for s in body if isinstance(s, CoopReduce)} == {lanes}
    rng = np.random.default_rng(k + n)
    w = rng.standard_normal((n, k)).astype(np.float32)
    sources = [np.asarray(s) for s in get_format(fmt).quantize(w)]
    x = rng.standard_normal((m, k)).astype(np.float32)
    got = run_lowering(prog, [x, *sources], out)
    want = x @ pw.dequantize(sources).T
    assert np.linalg.norm(got - want) / np.linalg.norm(want) < 1e-5


@pytest.mark.parametrize("features, fmt, k", [
    (frozenset({COPY_ASYNC}), "gguf:Q4_0", 2048),    # no large shared memory
    (frozenset({LARGE_SHARED}), "gguf:Q4_0", 2048),  # no async copies
    (RING, "gguf:Q4_0", 576),                        # units do not divide K
    (RING, "gguf:Q4_0", 512),                        # too few units for 4 lanes
    (RING, "gguf:Q8_0", 2048),                       # a unit of 68 words: too long
])
def test_other_schedules_where_the_ring_does_not_fit(features, fmt, k):
    *_, prog = _lowered(fmt, 1, 8, k, features)
    assert not any(isinstance(s, CopyAsync) for s in prog.kernels[0].statements())


@pytest.mark.parametrize("n, k, warps", [
    (4096, 14336, dot.RING_WARPS // 2),   # an 8B model's down projection: the shared budget
    (14336, 4096, dot.RING_WARPS),        # its gate and up projections
    (1024, 4096, 2),                      # its K and V: small workgroups, a grid of them
])
def test_ring_workgroups(n, k, warps):
    *_, prog = _lowered("gguf:Q4_0", 1, n, k, FEATURES)
    (kernel,) = prog.kernels
    assert kernel.workgroup == (dot.LANES * warps,)
    assert kernel.grid[0] >= min(dot.RING_GRID, n // 16)


@pytest.mark.parametrize("fmt, m, n, k", [
    ("gguf:Q4_0", 1, 100, 3072),    # 2 columns in turn, 3 trips each: the ring runs on
    ("gguf:Q4_K", 2, 200, 1024),    # 4 columns in turn, 1 trip each; spare columns
])
def test_ring_takes_columns_in_turn(monkeypatch, fmt, m, n, k):
    monkeypatch.setattr(dot, "RING_GRID", 1)
    pw, ins, out, prog = _lowered(fmt, m, n, k, FEATURES)
    (kernel,) = prog.kernels
    assert kernel.grid[0] * kernel.workgroup[0] < n * k // 256      # fewer lanes than units
    rng = np.random.default_rng(n)
    w = rng.standard_normal((n, k)).astype(np.float32)
    sources = [np.asarray(s) for s in get_format(fmt).quantize(w)]
    x = rng.standard_normal((m, k)).astype(np.float32)
    got = run_lowering(prog, [x, *sources], out)
    want = x @ pw.dequantize(sources).T
    assert np.linalg.norm(got - want) / np.linalg.norm(want) < 1e-5
