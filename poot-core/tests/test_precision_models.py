"""Whole steps under the precision levels and KV dtypes, on the reference backend and the
compiled cpu backend: each runs the rewritten graph as the oracle defines it (the same
logits step after step, teacher-forced), and the real SmolLM2 says the same text on both.

Op by op the backends agree exactly where the suite says (poot conformance: QuantizeI8's
codes bit for bit). Through a whole step a code whose product lies within an ulp of a tie
may round the other way on a backend that summed the norm before it in another order; one
such code moves one activation by its block's scale, so fast steps are compared within
the distance a few of them make (the rewrite itself moves logits by about as much as a
few flips, so that check cannot tell the levels apart: conformance and the SmolLM2 text
do), and exact steps tightly."""
from __future__ import annotations

import numpy as np
import pytest
import poot
from poot.compiler import Policy
from poot.models.llama import build_decoder, random_weights, tiny_config
from poot.runtime.session import Session

CFG = tiny_config(dim=64, heads=2, kv_heads=1, head_dim=32, ffn=96, max_seq=24)
PROMPT = [3, 17, 42, 8, 61]
FED = [5, 9, 77]


def logits_of(target: str, weights, precision: str, kv_dtype: str, kv: str):
    """Prefill logits, then the logits of decode steps fed FED, on `target`."""
    pool = {"pool_slots": 64} if kv == "paged" else {}

    def make(tokens, b):
        st = build_decoder(CFG, weights, tokens=tokens, batch=b, kv=kv, kv_dtype=kv_dtype,
                           **pool)
        return poot.compile(st.graph, target, policy=Policy(precision=precision))
    consts = {**weights.arrays, **build_decoder(CFG, weights, kv=kv, **pool).consts}
    s = Session(make, consts, kv=kv, capacity=CFG.max_seq, prefill_tokens=4, target=target,
                **({"pool_slots": 64, "block": 4} if kv == "paged" else {}))
    s.open("a")
    out = [np.asarray(s.prefill("a", PROMPT), np.float32)]
    for tok in FED:
        out.append(np.asarray(s.decode({"a": tok})["a"], np.float32))
    return np.stack(out)


def _runnable(backend: str) -> str:
    """`backend`'s name, or a skip with the reason its probe gives (no device, not installed)."""
    from poot.plugin import get_backend

    try:
        reason = get_backend(backend).unavailable_reason()
    except Exception as exc:      # not installed, or its plugin failed to load
        reason = f"{backend}: {type(exc).__name__}: {exc}"
    if reason:
        pytest.skip(reason)
    return backend


@pytest.mark.parametrize("backend", ["cpu", "cuda"])
@pytest.mark.parametrize("fmt,dtype,precision,kv_dtype,kv", [
    ("gguf:Q4_0", "f32", "fast", "f16", "dense"),
    ("gguf:Q5_1", "f32", "fast", "q8_0", "paged"),
    (None, "bf16", "fast", "q8_0", "dense"),
    ("gguf:Q8_0", "f32", "exact", "f16", "paged"),
])
def test_backend_runs_the_rewritten_graph_as_the_oracle(backend, fmt, dtype, precision,
                                                         kv_dtype, kv):
    target = _runnable(backend)
    w = random_weights(CFG, seed=7, dtype=dtype, packed_format=fmt)
    want = logits_of("reference", w, precision, kv_dtype, kv)
    got = logits_of(target, w, precision, kv_dtype, kv)
    nmse = float(np.sum((got - want) ** 2) / np.sum(want ** 2))
    assert nmse < (2e-3 if precision == "fast" else 1e-7), nmse
    if precision == "fast" or kv_dtype != "f32":     # the rewrite is not a no-op here
        plain = logits_of("reference", w, "exact", "f32", kv)
        assert not np.allclose(plain, want, rtol=1e-6, atol=1e-6)


@pytest.mark.slow
def test_smollm2_text_is_the_same_on_reference_and_cpu(smollm2_gguf):
    prompt = "The capital of France is"
    texts = {}
    for precision, kv_dtype in (("exact", None), ("fast", None), ("fast", "q8_0")):
        for backend in ("reference", "cpu"):
            m = poot.load(str(smollm2_gguf), backend, max_seq=64, precision=precision,
                          kv_dtype=kv_dtype)
            texts[precision, kv_dtype, backend] = "".join(m.generate(prompt, max_tokens=8))
    for precision, kv_dtype in (("exact", None), ("fast", None), ("fast", "q8_0")):
        assert texts[precision, kv_dtype, "reference"] == texts[precision, kv_dtype, "cpu"]
    assert texts["exact", None, "cpu"].startswith(" Paris")
    assert texts["fast", None, "cpu"].startswith(" Paris")
