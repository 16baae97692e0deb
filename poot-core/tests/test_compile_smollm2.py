"""The real SmolLM2-135M GGUF (Q4_1 projections, Q8_0 embedding, tied head, pair-ordered
RoPE rows): compile finds every composite, and the oracle agrees on its real weights."""
from __future__ import annotations

import dataclasses
from collections import Counter

import poot
import pytest
from poot.compiler.validate import validate


@pytest.fixture(scope="module")
def smollm2_step(smollm2_gguf):
    from poot.models.llama import build_decoder
    from poot.models.loader import open_model
    from poot.models.weights import CheckpointWeights

    ckpt, config = open_model(str(smollm2_gguf), max_seq=64, pull_missing=False)
    weights = CheckpointWeights(ckpt)
    step = build_decoder(dataclasses.replace(config, layers=2), weights, tokens=1)
    return step, {**weights.arrays, **step.consts}


@pytest.mark.slow
def test_smollm2_two_layers(smollm2_step):
    step, consts = smollm2_step
    compiled = poot.compile(step.graph, "reference")
    ops = Counter(e.op.name for e in compiled.graph.eqns())
    print(f"\nSmolLM2, 2 layers: {len(step.graph.eqns())} -> {len(compiled.graph.eqns())} "
          f"eqns: {dict(ops.most_common())}")
    # per layer q|k|v (one contraction over the stacked rows; Slices take q|k and v, one
    # Rope rotates q|k, two Slices take q and k of it) and gate|up (Slices take gate and
    # up for the SwiGLU); the head; each with the RMSNorm before it inside: no norm is
    # left apart
    assert ops["NormedPackedContraction"] == 2 * 2 + 1 and ops["PackedRowGather"] == 1
    assert not {"PackedContraction", "FusedRow"} & set(ops)
    assert ops["Slice"] == 2 * 6
    assert ops["Attention"] == 2 and ops["Rope"] == 2 and ops["ContractionEpilogue"] == 4
    assert not {"MatMul", "PackedDequant", "Reduce"} & set(ops)
    validate(step.graph, compiled.graph, seed=5, trials=1, given=consts)
