"""attention_rows: a dense step of several tokens attends over its query rows where they
are ([T, Hq, D]) and writes its output so (TokenMajorAttention, no Transposes around it);
one token keeps Attention (its Transposes are Reshapes); a target without it keeps the
Transposes. The compiled step keeps the traced one's meaning."""
from __future__ import annotations

from collections import Counter

import poot
import pytest
from poot.compiler import LimitedBackend
from poot.compiler.validate import validate
from poot.models.llama import build_decoder, const_inputs, random_weights, tiny_config
from poot.plugin import get_backend

LAYERS = 2


def compiled(tokens: int, refused=frozenset()):
    config = tiny_config(layers=LAYERS, max_seq=32)
    weights = random_weights(config, seed=6, dtype="f32")
    step = build_decoder(config, weights, tokens=tokens,
                         logits="last" if tokens > 1 else "all")
    target = (LimitedBackend(get_backend("reference"), set(refused)), None)
    return step, weights, poot.compile(step.graph, target)


@pytest.mark.parametrize("tokens", [3, 8])
def test_a_wider_step_attends_over_its_rows_where_they_are(tokens):
    step, weights, c = compiled(tokens)
    ops = Counter(e.op.name for e in c.graph.eqns())
    assert ops["TokenMajorAttention"] == LAYERS and not ops["Attention"]
    assert not ops["Transpose"]            # q's, the result's, and the cache writes'
    assert "Transpose + Attention + Transpose" in c.explain()
    validate(step.graph, c.graph, seed=2, trials=2, given=const_inputs(step, weights))


def test_one_token_keeps_attention():
    _, _, c = compiled(1)
    ops = Counter(e.op.name for e in c.graph.eqns())
    assert ops["Attention"] == LAYERS and not ops["TokenMajorAttention"]


def test_targets_without_it_keep_the_transposes():
    _, _, c = compiled(3, {"TokenMajorAttention"})
    ops = Counter(e.op.name for e in c.graph.eqns())
    assert ops["Attention"] == LAYERS and ops["Transpose"] == 2 * LAYERS
    assert "target refuses" in c.explain()
