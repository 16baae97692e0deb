"""GGUF llama/mistral q/k rows (adjacent pairs per head) are reordered once, in the weights
(poot.models.weights.RowLayout): a "pairs" checkpoint traces the same step as the
rotate-half checkpoint it was converted from, with no permutation of activations."""
from __future__ import annotations

import sys
from collections import Counter
from dataclasses import replace
from pathlib import Path

import numpy as np
import poot
import pytest
from poot.errors import CheckpointError
from poot.models.llama import ArrayWeights, build_decoder, const_inputs, random_weights, tiny_config
from poot.models.weights import RowLayout

# the helpers beside this file (pytest's importlib mode puts no test folder on sys.path)
sys.path.insert(0, str(Path(__file__).parent))
from test_runtime_support import OracleStepper  # noqa: E402

HALF = tiny_config(layers=1, qkv_bias=True)
PAIRS = replace(HALF, rope_layout="pairs")


def converted(rows: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's converter permutation (convert_hf_to_gguf.py, LlamaModel.permute) of
    HF rows, applied to any array with one row per output row."""
    return rows.reshape(heads, 2, rows.shape[0] // heads // 2, *rows.shape[1:]) \
        .swapaxes(1, 2).reshape(rows.shape)


def as_gguf(w: ArrayWeights, c) -> ArrayWeights:
    """The checkpoint llama.cpp writes from `w`: q/k rows (and every packed source of them
    with one row per output row; blocks lie within rows) in adjacent pairs."""
    out = ArrayWeights("as-gguf")
    for name, s in w.specs.items():
        heads = c.heads if ".attn_q." in name else c.kv_heads
        if ".attn_q." not in name and ".attn_k." not in name:
            out.specs[name] = s
            out.arrays.update({r.tensor: w.arrays[r.tensor]
                               for r in (s.refs if hasattr(s, "refs") else (s.ref,))})
        elif hasattr(s, "refs"):
            n = s.weight.shape[0]
            out.add_packed(name, s.weight, [
                converted(a, heads) if a.shape[:1] == (n,) else a
                for a in (w.arrays[r.tensor] for r in s.refs)])
        else:
            out.add_dense(name, converted(w.arrays[s.ref.tensor], heads))
    return out


def prefill_logits(c, w) -> np.ndarray:
    step = build_decoder(c, w, tokens=5)
    return OracleStepper(step.graph, const_inputs(step, w)).step(
        {"tokens": [3, 41, 7, 90, 12], "pos": [0]})


@pytest.mark.parametrize("kw", [dict(dtype="f32"), dict(dtype="bf16"), dict(dtype="f16words"),
                                dict(packed_format="gguf:Q4_1"), dict(packed_format="nvfp4"),
                                dict(packed_format="fp8:e4m3")],
                         ids=lambda kw: next(iter(kw.values())))
def test_a_pairs_checkpoint_runs_as_the_half_checkpoint_it_was_converted_from(kw):
    half = random_weights(HALF, seed=4, **kw)
    gguf = as_gguf(half, HALF)
    want = prefill_logits(HALF, half)
    np.testing.assert_allclose(prefill_logits(PAIRS, gguf), want, rtol=1e-5, atol=1e-5)
    # the same graph as the half layout's: no Transpose, Reshape or Gather added
    ops = [Counter(e.op.name for e in build_decoder(c, w).graph.eqns())
           for c, w in ((HALF, half), (PAIRS, gguf))]
    assert ops[0] == ops[1]


def test_reordered_rows_have_their_own_identity_and_are_made_once():
    gguf = as_gguf(random_weights(HALF, seed=1, packed_format="nvfp4"), HALF)
    decode, prefill = build_decoder(PAIRS, gguf), build_decoder(PAIRS, gguf, tokens=4)
    rows = RowLayout(gguf, HALF.head_dim)
    q, stored = rows.spec("blk.0.attn_q.weight"), gguf.spec("blk.0.attn_q.weight")
    # the rows (weight, block scales) are new tensors; the per-tensor scale is the stored one
    assert [r.tensor for r in q.refs] == ["blk.0.attn_q.weight:weight~half",
                                          "blk.0.attn_q.weight:weight_scale~half",
                                          "blk.0.attn_q.weight:weight_scale_2"]
    assert q.refs[0].payload != stored.refs[0].payload and q.refs[2] == stored.refs[2]
    for label in ("blk.0.attn_q.weight:weight~half", "blk.0.attn_k.bias~half"):
        assert decode.consts[label] is prefill.consts[label] is rows.arrays[label]
    labels = {decode.graph.meta(v).identity.label for v in decode.graph.consts()}
    assert {"blk.0.attn_v.weight:weight", "blk.0.attn_v.bias"} <= labels   # v keeps its rows
    assert {"blk.0.attn_q.weight:weight", "blk.0.attn_k.bias"}.isdisjoint(labels)


def test_a_format_that_packs_output_rows_together_is_refused():
    c = tiny_config(layers=1, dim=128, heads=4, kv_heads=2, head_dim=32, rope_layout="pairs")
    w = random_weights(c, seed=2, packed_format="gptq:int4")
    with pytest.raises(CheckpointError, match=r"attn_q.weight: gptq:int4\[128x128\]: source "
                                              "'qweight' does not hold one row per output row"):
        build_decoder(c, w)


@pytest.mark.slow
def test_smollm2_steps_permute_no_activations(smollm2_gguf):
    """The real GGUF (pairs layout): the compiled decode step has no Transpose; prefill keeps
    only the moves of whole heads between [T, H, D] and [H, T, D]."""
    from poot.models.loader import open_model
    from poot.models.weights import CheckpointWeights

    ckpt, config = open_model(str(smollm2_gguf), max_seq=64, pull_missing=False)
    config, weights = replace(config, layers=2), CheckpointWeights(ckpt)
    assert config.rope_layout == "pairs"
    for tokens, kv, batch in ((1, "dense", 1), (1, "paged", 2), (8, "dense", 1)):
        step = build_decoder(config, weights, tokens=tokens, kv=kv, batch=batch)
        g = poot.compile(step.graph, "reference").graph
        perms = [e.op.perm for e in g.eqns() if e.op.name == "Transpose"]
        assert all(p in ((1, 0, 2), (0, 2, 1, 3)) for p in perms), perms
        if (tokens, kv) == (1, "dense"):
            assert not perms
