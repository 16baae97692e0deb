"""q, k and v from one weight stacked by rows (build_decoder's stack_qkv, RowLayout), and
the FFN's gate and up likewise (stack_ffn): the same logits as separate weights, for one
token (one contraction, its rows viewed) and wider steps (each over its rows of the
weight), dense and packed, rotate-half and pair-ordered sources, on the reference and the
compiled cpu backend; a one-token dense step rotates its q and k heads with one Rope."""
from __future__ import annotations

import sys
from collections import Counter
from dataclasses import replace
from pathlib import Path

import numpy as np
import poot
import pytest
from poot.models.llama import build_decoder, random_weights, tiny_config
from poot.models.weights import RowLayout, stacked
from poot.plan import plan
from poot.runtime.executor import Executor

sys.path.insert(0, str(Path(__file__).parent))   # the helpers beside this file
from test_runtime_support import backend_target  # noqa: E402

#: q rows 256 f32 = 1 KiB, kv 64 rows: every part starts on a 256-byte boundary; every K a
#: multiple of Q4_K's 256-element blocks
CONFIG = tiny_config(layers=2, dim=256, heads=8, kv_heads=2, head_dim=32, ffn=256,
                     qkv_bias=True)


def logits(target, c, w, stack: bool, tokens: int, kv: str = "dense", stack_ffn=False):
    batch = 2 if kv == "paged" else 1
    step = build_decoder(c, w, tokens=tokens, batch=batch, kv=kv, stack_qkv=stack,
                         stack_ffn=stack_ffn, pool_slots=64 if kv == "paged" else None)
    p = plan(poot.compile(step.graph, target), target)
    ex = Executor(p, {**w.arrays, **step.consts})
    rng = np.random.default_rng(tokens)
    slots = {"tokens": rng.integers(0, c.vocab, (batch, tokens) if kv == "paged" else tokens),
             "pos": np.full((batch, 1) if kv == "paged" else 1, 3)}
    if kv == "paged":
        slots["write_map"] = np.arange(batch * tokens) + 8
        slots["slot_map"] = np.tile(np.arange(c.max_seq), (batch, 1))
    return ex.step(slots).result, p


FORMATS = [(None, "half"), ("gguf:Q8_0", "pairs"), ("gguf:Q4_K", "half")]
STEPS = [(1, "dense"), (4, "dense"), (1, "paged")]
#: every format and step on the reference; on cpu (gcc per plan) each format once
CASES = [("reference", *f, *s) for f in FORMATS for s in STEPS] + [
    ("cpu", *f, *s) for f, s in zip(FORMATS, STEPS, strict=True)]


def stacked_and_apart(backend, fmt, layout, tokens, kv, part: str, ffn: bool):
    """(plan apart, plan stacked, config) of one case, after checking their logits agree
    and that the stacked plan binds `part` only inside a stack; `ffn`: gate and up are
    the stack compared (q, k and v stacked in both), else q, k and v."""
    target = backend_target(backend)
    c = replace(CONFIG, rope_layout=layout)
    w = random_weights(c, seed=5 if ffn else 3, packed_format=fmt)
    want, apart = logits(target, c, w, ffn, tokens, kv)
    got, p = logits(target, c, w, True, tokens, kv, stack_ffn=ffn)
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5 * np.abs(want).max())
    bound = {r.name for r in p.regions.values() if r.kind == "weight"}
    assert not any(part in n and "+" not in n for n in bound)   # one weight
    return apart, p, c


@pytest.mark.parametrize("backend,fmt,layout,tokens,kv", CASES)
def test_stacked_projection_equals_three_weights(backend, fmt, layout, tokens, kv):
    apart, p, c = stacked_and_apart(backend, fmt, layout, tokens, kv, "attn_q.weight", False)
    ops = Counter(s.eqn.op.name for s in p.steps)
    heads = {"DenseContraction", "PackedContraction", "ContractionEpilogue"}  # bias: epilogue
    kernels = [sum(n for op, n in Counter(s.eqn.op.name for s in x.steps).items()
                   if op in heads) for x in (apart, p)]
    if backend == "reference":                       # numpy kernels: no contractions
        return
    if tokens * (2 if kv == "paged" else 1) == 1:   # one contraction instead of three
        assert kernels[0] - kernels[1] == 2 * c.layers
    else:                                            # three, over rows of one weight
        assert kernels[0] == kernels[1]
    assert "Slice" not in ops                        # every slice a view: no copy kernels
    if kv == "dense" and tokens == 1:                # q and k rotated by one Rope a layer
        ropes = [Counter(s.eqn.op.name for s in x.steps)["Rope"] for x in (apart, p)]
        assert ropes == [2 * c.layers, c.layers]


@pytest.mark.parametrize("backend,fmt,layout,tokens,kv", CASES)
def test_stacked_gate_and_up_equal_two_weights(backend, fmt, layout, tokens, kv):
    apart, p, c = stacked_and_apart(backend, fmt, layout, tokens, kv, "ffn_up.weight", True)
    if backend == "reference":
        return
    heads = {"DenseContraction", "PackedContraction", "ContractionEpilogue",
             "NormedPackedContraction"}
    kernels = [sum(s.eqn.op.name in heads for s in x.steps) for x in (apart, p)]
    one = tokens * (2 if kv == "paged" else 1) == 1
    assert kernels[0] - kernels[1] == (c.layers if one else 0)
    assert "Slice" not in Counter(s.eqn.op.name for s in p.steps)   # gate and up: views


def test_stacks_are_served_only_where_the_parts_agree():
    c = replace(CONFIG, layers=1)
    names = [f"blk.0.attn_{x}.weight" for x in "qkv"]
    packed = RowLayout(random_weights(c, seed=1, packed_format="gguf:Q8_0"))
    assert packed.has(stacked(names))
    spec = packed.spec(stacked(names))
    assert spec.weight.shape == (8 * 32 + 2 * 2 * 32, 256)
    assert not packed.has(stacked(names[:2] + ["blk.0.ffn_norm.weight"]))     # not packed
    assert not packed.has(stacked(names[:2] + ["blk.0.nothing.weight"]))
    gptq = RowLayout(random_weights(c, seed=1, packed_format="gptq:int4"))
    assert not gptq.has(stacked(names))          # output rows packed into words
