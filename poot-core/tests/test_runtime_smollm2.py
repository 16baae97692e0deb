"""The real SmolLM2-135M (Q4_1 GGUF) through compile, plan, executor and Session: greedy
decoding after a prompt says " Paris", with weights decoded once and no step allocating."""
from __future__ import annotations

import numpy as np
import pytest
from poot.models.hub import smollm2_path


@pytest.fixture(scope="module")
def smollm2(smollm2_gguf):
    from poot.models.llama import build_decoder
    from poot.models.loader import open_model
    from poot.models.tokenizer import Tokenizer
    from poot.models.weights import CheckpointWeights

    ckpt, config = open_model(str(smollm2_gguf), max_seq=64, pull_missing=False)
    weights = CheckpointWeights(ckpt)

    def make(tokens, batch):
        return build_decoder(config, weights, tokens=tokens, batch=batch, kv="paged",
                             pool_slots=128)
    consts = dict(make(1, 1).consts)
    make(8, 1)                       # declares every tensor, so weights.arrays is complete
    consts.update(weights.arrays)
    return config, make, consts, Tokenizer.from_gguf(smollm2_path())


@pytest.mark.slow
def test_smollm2_session_greedy_says_paris(smollm2):
    from poot.runtime.session import Session

    config, make, consts, tok = smollm2
    s = Session(make, consts, kv="paged", capacity=config.max_seq, batch=2, prefill_tokens=8,
                pool_slots=128, block=16, target="reference")
    s.open("france")
    s.open("count")
    logits = {"france": s.prefill("france", tok.encode("The capital of France is")),
              "count": s.prefill("count", tok.encode("One, two, three,"))}
    out = {k: [int(np.argmax(v))] for k, v in logits.items()}
    ex = s.executor(1, 2)
    allocs = ex.runtime.allocs
    for _ in range(3):
        got = s.decode({k: v[-1] for k, v in out.items()})
        for k in out:
            out[k].append(int(np.argmax(got[k])))
    assert ex.runtime.allocs == allocs
    assert tok.decode(out["france"]).startswith(" Paris")
    assert tok.decode(out["count"]).startswith(" four")
    # one upload per distinct weight: the tied Q8_0 embedding is decoded once for both
    # its gather and the head, and the prefill and decode plans share every weight
    decoded = [r for r in ex.plan.weight_regions() if r.weight.representation == "f32-decoded"]
    assert len({r.name for r in decoded}) == 7 * config.layers + 1
    assert s.weights.hits >= len(decoded)          # the decode plan re-bound no weight
