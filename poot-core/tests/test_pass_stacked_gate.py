"""stacked_gate: a step of several rows contracts gate and up each over its half of the
stacked gate|up weight, the second taking the SwiGLU as its epilogue; the two become one
GatedContraction over the whole weight, up to MAX_ROWS rows, on targets that form it.
The compiled step keeps the traced one's meaning."""
from __future__ import annotations

from collections import Counter

import poot
import pytest
from poot.compiler import LimitedBackend
from poot.compiler.passes.stacked_gate import MAX_ROWS
from poot.compiler.validate import validate
from poot.models.llama import build_decoder, const_inputs, random_weights, tiny_config
from poot.plugin import get_backend

LAYERS = 2
#: as on CUDA: the norms stay apart, the SwiGLU is no prologue of the down projection
APART = frozenset({"ContractionPrologue", "NormedPackedContraction", "NormedDenseContraction"})


def compiled(tokens: int, refused=APART, fmt="gguf:Q4_0"):
    config = tiny_config(layers=LAYERS, max_seq=64)
    weights = random_weights(config, seed=4, dtype="f32", packed_format=fmt)
    step = build_decoder(config, weights, tokens=tokens, stack_ffn=True, logits="last")
    target = (LimitedBackend(get_backend("reference"), set(refused)), None)
    return step, weights, poot.compile(step.graph, target)


def gated_heads(c) -> list:
    return [e for e in c.graph.eqns() if e.op.name == "GatedContraction"]


@pytest.mark.parametrize("tokens, fmt", [(2, "gguf:Q4_0"), (8, "gguf:Q4_0"), (8, None)])
def test_the_halves_of_a_stacked_gate_become_one_contraction(tokens, fmt):
    step, weights, c = compiled(tokens, fmt=fmt)
    gated = gated_heads(c)
    assert len(gated) == LAYERS
    ffn = tiny_config().ffn
    for e in gated:      # the whole [2F, K] stack (its leading axis), not a half of it
        assert c.graph.type_of(e.inputs[1].id).shape[0] == 2 * ffn
    assert "over both halves of its weight" in c.explain()
    validate(step.graph, c.graph, seed=3, trials=2, given=const_inputs(step, weights))


def test_wider_steps_keep_the_epilogue():
    _, _, c = compiled(MAX_ROWS + 8)
    assert not gated_heads(c)
    assert Counter(e.op.name for e in c.graph.eqns())["ContractionEpilogue"] >= 2 * LAYERS


def test_targets_without_it_keep_two_contractions():
    _, _, c = compiled(8, APART | {"GatedContraction"})
    assert not gated_heads(c)
    assert "target refuses" in c.explain()
