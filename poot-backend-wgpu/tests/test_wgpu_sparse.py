"""A sparse-attention indexer written as primitive chains, compiled for wgpu: the selection
pass finds BlockTopK and SelectedAttention, their kernels run on the device, and the
result equals the oracle's evaluation of the chains."""
from __future__ import annotations

import numpy as np
import poot
from poot.ir.builder import Builder
from poot.ir.ops import BlockTopK, SelectedAttention
from poot.ir.types import TensorType
from poot.oracle import evaluate
from poot.plan import plan
from poot.runtime import Executor

H, T, S, D, BLOCK, K = 2, 5, 32, 16, 4, 3


def indexer_graph():
    b = Builder("indexer")
    q = b.const(TensorType((H, T, D), "f32"), "q")
    kk = b.const(TensorType((H, S, D), "f32"), "k")
    v = b.const(TensorType((H, S, D), "f32"), "v")
    mask = b.const(TensorType((T, S), "f32"), "mask")
    blocks = BlockTopK(BLOCK, K).define(b, [q, kk])
    b.result(SelectedAttention(BLOCK, D ** -0.5).define(b, [q, kk, v, blocks, mask]))
    return b.finish()


def test_indexer_runs_as_two_kernels_on_wgpu(wgpu_device):
    rng = np.random.default_rng(5)
    consts = {"q": rng.integers(-3, 4, (H, T, D)).astype(np.float32),   # integers: exact scores
              "k": rng.integers(-3, 4, (H, S, D)).astype(np.float32),
              "v": rng.standard_normal((H, S, D)).astype(np.float32),
              "mask": np.where(rng.random((T, S)) < 0.9, 0.0, -np.inf).astype(np.float32)}
    g = indexer_graph()
    compiled = poot.compile(g, "wgpu")
    assert [e.op.name for e in compiled.graph.eqns()] == ["BlockTopK", "SelectedAttention"]
    got = Executor(plan(compiled), consts).step({}).result
    (want,) = evaluate(g, [consts[n] for n in ("q", "k", "v", "mask")], outputs="result")
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
