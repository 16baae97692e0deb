"""The selection pass: a sparse-attention indexer written as primitive chains becomes
BlockTopK + SelectedAttention; a target that cannot plan them refuses, typed."""
from __future__ import annotations

import poot
import pytest
from poot import ops
from poot.compiler import LimitedBackend
from poot.compiler.validate import validated_pass
from poot.errors import UnsupportedOp
from poot.ir.builder import Builder
from poot.ir.ops import BlockTopK, SelectedAttention
from poot.ir.types import SlotKind, TensorType
from poot.plugin import get_backend


def indexer_graph(h=2, t=3, s=16, d=8, block=4, k=2):
    """The indexer as a model author writes it: the primitive chains only (a plain
    Builder refuses compiler-only composites, so these are primitives)."""
    b = Builder("indexer")
    q = b.const(TensorType((h, t, d), "f32"), "q")
    kk = b.const(TensorType((h, s, d), "f32"), "k")
    v = b.const(TensorType((h, s, d), "f32"), "v")
    mask = b.const(TensorType((t, s), "f32"), "mask")
    blocks = BlockTopK(block, k).define(b, [q, kk])
    b.result(SelectedAttention(block, d ** -0.5).define(b, [q, kk, v, blocks, mask]))
    return b.finish()


def test_indexer_becomes_two_composites():
    g = indexer_graph()
    out, rec = validated_pass(g, "selection", seed=3)
    names = [e.op.name for e in out.eqns()]
    assert names.count("BlockTopK") == 1 and names.count("SelectedAttention") == 1
    assert len(out.eqns()) == 2, names
    assert {d.candidate for d in rec.decisions if d.rewritten} == {"BlockTopK",
                                                                   "SelectedAttention"}


def test_plain_attention_and_moe_topk_are_not_selection():
    def fn(q, k, v, pos, logits):
        ids, _ = ops.moe_route(logits, 2)
        return ops.attention_masked(q, k, v, ops.causal_mask(pos, 2, 8))

    g = poot.trace(fn, poot.spec((2, 2, 4)), poot.spec((2, 8, 4)), poot.spec((2, 8, 4)),
                   poot.spec((1,), "i32", kind="slot", slot=SlotKind.POS, bound=7),
                   poot.spec((3, 6)))
    out, rec = validated_pass(g, "selection")
    assert rec.rewrites == 0 and len(rec.decisions) == 2
    assert out is g


@pytest.mark.parametrize("missing", ["BlockTopK", "SelectedAttention"])
def test_target_that_cannot_plan_them_refuses(missing):
    ref = get_backend("reference")
    with pytest.raises(UnsupportedOp, match=missing):
        poot.compile(indexer_graph(), (LimitedBackend(ref, {missing}), None))
