"""Hosted embedding rows: a step that takes rows from the host for chosen positions equals
the oracle on a graph that adds those rows to the embedding table by hand."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from poot import plugin
from poot.errors import BindError, SlotRangeError
from poot.models import hosted_rows
from poot.models.llama import (
    ArrayWeights,
    build_decoder,
    const_inputs,
    random_weights,
    tiny_config,
)
from poot.oracle import evaluate

T = 6
HOSTED = (1, 4)


def _case():
    c = tiny_config(tied=False, embed_scale=2.0)
    w = random_weights(c, seed=3)
    rng = np.random.default_rng(4)
    rows = {p: rng.standard_normal(c.dim).astype(np.float32) for p in HOSTED}
    ids = rng.integers(0, c.vocab, T).astype(np.int32)
    return c, w, rows, ids


def _empty_cache(graph) -> dict:
    return {graph.meta(v).identity.label: np.zeros(graph.type_of(v).shape, np.float32)
            for v, _ in graph.state()}


def _by_hand(c, w, rows, ids):
    """The oracle's logits of a plain step whose table holds the rows as extra tokens
    (divided by the embedding scale, which the step then applies)."""
    wide = ArrayWeights("by-hand")
    for name in w.specs:
        wide.add_dense(name, w.arrays[name])
    extra = np.stack([rows[p] / c.embed_scale for p in HOSTED])
    wide.add_dense("token_embd.weight", np.concatenate([w.arrays["token_embd.weight"], extra]))
    cw = replace(c, vocab=c.vocab + len(HOSTED))
    step = build_decoder(cw, wide, tokens=T)
    ids = ids.copy()
    for i, p in enumerate(HOSTED):
        ids[p] = c.vocab + i
    return evaluate(step.graph, {**const_inputs(step, wide), **_empty_cache(step.graph),
                                 "tokens": ids, "pos": [0]}, outputs="result")[0]


@pytest.mark.parametrize("backend", ["reference", "wgpu", "cuda"])
def test_hosted_rows_equal_rows_added_by_hand(backend):
    import poot
    from poot.plan import plan
    from poot.runtime.executor import Executor

    c, w, rows, ids = _case()
    want = _by_hand(c, w, rows, ids)
    b = plugin.get_backend(backend)
    devs, why = plugin.probe(b)
    if not devs:
        pytest.skip(f"backend {backend} finds no device here: {why}")
    step = build_decoder(c, w, tokens=T, hosted_rows=True)
    ex = Executor(plan(poot.compile(step.graph, (b, devs[0])), (b, devs[0])),
                  const_inputs(step, w))
    got = ex.step({"tokens": ids, "pos": [0],
                   **hosted_rows.slot_values(rows, T, c.dim)}).result
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    plain = ex.step({"tokens": ids, "pos": [0], **hosted_rows.slot_values({}, T, c.dim)})
    assert not np.allclose(plain.result, want, atol=1e-3)   # the rows did change the step


def test_hosted_slots_are_declared_and_checked():
    assert {"hosted.rows", "hosted.use"} <= set(plugin.manager().slot_roles())
    c, w, rows, ids = _case()
    step = build_decoder(c, w, tokens=T, hosted_rows=True)
    slots = hosted_rows.slot_values(rows, T, c.dim)
    slots["hosted.use"][0] = 2
    with pytest.raises(SlotRangeError, match="hosted.use"):
        evaluate(step.graph, {**const_inputs(step, w), **_empty_cache(step.graph),
                              "tokens": ids, "pos": [0], **slots})
    with pytest.raises(BindError, match="outside"):
        hosted_rows.slot_values({T: rows[1]}, T, c.dim)
    with pytest.raises(BindError, match="shape"):
        hosted_rows.slot_values({0: rows[1][:3]}, T, c.dim)
