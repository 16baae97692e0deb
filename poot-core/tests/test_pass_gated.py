"""gated: a Fused region that alone reads both halves of a contraction's last axis (a
stacked gate|up projection's SwiGLU) becomes one GatedContraction, on targets that
declare it and not ContractionPrologue (which takes the region into the down projection
first); the compiled step keeps the traced one's meaning."""
from __future__ import annotations

from collections import Counter

import poot
import pytest
from poot.compiler import LimitedBackend
from poot.compiler.validate import validate
from poot.models.llama import build_decoder, const_inputs, random_weights, tiny_config
from poot.plugin import get_backend


def compiled(refused: set, fmt="gguf:Q4_0"):
    config = tiny_config(layers=2)
    weights = random_weights(config, seed=4, dtype="f32", packed_format=fmt)
    step = build_decoder(config, weights, tokens=1, stack_ffn=True)
    target = (LimitedBackend(get_backend("reference"), refused), None)
    return step, weights, poot.compile(step.graph, target)


@pytest.mark.parametrize("fmt", ["gguf:Q4_0", None])
def test_the_swiglu_joins_its_gate_and_up_projection(fmt):
    step, weights, c = compiled({"ContractionPrologue"}, fmt)
    ops = Counter(e.op.name for e in c.graph.eqns())
    assert ops["GatedContraction"] == 2 and ops["Fused"] == 1      # each layer; the mask
    gated = [e.op for e in c.graph.eqns() if e.op.name == "GatedContraction"]
    want = "PackedContraction" if fmt else "DenseContraction"     # normed or not
    assert all(op.head.name.endswith(want) for op in gated)
    validate(step.graph, c.graph, seed=3, trials=2, given=const_inputs(step, weights))


def test_targets_without_it_keep_the_region():
    _, _, c = compiled({"ContractionPrologue", "GatedContraction"})
    ops = Counter(e.op.name for e in c.graph.eqns())
    assert "GatedContraction" not in ops and ops["Fused"] == 3
    assert "target refuses" in c.explain()
