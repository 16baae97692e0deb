"""The numpy reference Llama: its RoPE convention, and the real SmolLM2 through it."""
from __future__ import annotations

import numpy as np
import pytest
from reference_llama import (
    causal_gqa_attention,
    greedy_tokens,
    prefill_logits,
    rope_adjacent_pairs,
)


def _rotate_half_rope(x, positions, base):
    """HF Llama's RoPE on HF-layout heads: pairs (i, i + d/2)."""
    d = x.shape[-1]
    angle = positions[:, None] * base ** (-np.arange(0, d, 2) / d)[None, :]
    cos = np.concatenate([np.cos(angle)] * 2, axis=-1)[:, None, :]
    sin = np.concatenate([np.sin(angle)] * 2, axis=-1)[:, None, :]
    rotated = np.concatenate([-x[..., d // 2:], x[..., : d // 2]], axis=-1)
    return x * cos + rotated * sin


def _hf_rows_to_gguf(x):
    """llama.cpp's converter permutation of q/k rows within a head: HF i -> 2i, i+d/2 -> 2i+1."""
    d = x.shape[-1]
    return x.reshape(*x.shape[:-1], 2, d // 2).swapaxes(-1, -2).reshape(x.shape)


def test_adjacent_pair_rope_on_gguf_rows_equals_rotate_half_on_hf_rows():
    rng = np.random.default_rng(7)
    hf_q, hf_k = rng.standard_normal((2, 5, 3, 64))
    positions = np.arange(5) + 11
    gguf_q = rope_adjacent_pairs(_hf_rows_to_gguf(hf_q), positions, 10000.0)
    gguf_k = rope_adjacent_pairs(_hf_rows_to_gguf(hf_k), positions, 10000.0)
    np.testing.assert_allclose(gguf_q, _hf_rows_to_gguf(_rotate_half_rope(hf_q, positions, 1e4)),
                               atol=1e-12)
    # the attention scores do not see the permutation at all
    hf_scores = np.einsum("qhd,khd->hqk", _rotate_half_rope(hf_q, positions, 1e4),
                          _rotate_half_rope(hf_k, positions, 1e4))
    np.testing.assert_allclose(np.einsum("qhd,khd->hqk", gguf_q, gguf_k), hf_scores, atol=1e-10)


def test_attention_is_causal_and_groups_query_heads():
    rng = np.random.default_rng(3)
    q, k, v = rng.standard_normal((4, 6, 8)), rng.standard_normal((4, 2, 8)), \
        rng.standard_normal((4, 2, 8))
    out = causal_gqa_attention(q, k, v)
    assert np.allclose(out[0], v[0, [0, 0, 0, 1, 1, 1]])  # position 0 sees only itself
    changed = v.copy()
    changed[3] += 1.0  # the last position's value must not reach earlier positions
    assert np.allclose(causal_gqa_attention(q, k, changed)[:3], out[:3])


@pytest.mark.slow
def test_smollm2_greedy_next_token_is_paris(smollm2_gguf):
    from poot.models.tokenizer import Tokenizer

    tokenizer = Tokenizer.from_gguf(smollm2_gguf)
    ids = tokenizer.encode("The capital of France is")
    logits = prefill_logits(smollm2_gguf, ids)
    assert logits.shape == (len(ids), 49152) and logits.dtype == np.float32
    assert np.isfinite(logits).all()
    assert tokenizer.decode([int(np.argmax(logits[-1]))]) == " Paris"
    # causal: a prefix's logits do not depend on the tokens after it
    np.testing.assert_allclose(prefill_logits(smollm2_gguf, ids[:3]), logits[:3], atol=1e-4)
    assert tokenizer.decode(greedy_tokens(smollm2_gguf, ids, 3)).startswith(" Paris")


@pytest.mark.slow
def test_smollm2_predicts_natural_text_well(smollm2_gguf):
    # Mean next-token NLL of a natural sentence; reading the GGUF q/k rows with HF's
    # rotate_half RoPE instead of adjacent pairs measures 3.2 nats here, the right RoPE 1.83.
    from poot.models.tokenizer import Tokenizer

    text = ("The Eiffel Tower is a wrought-iron lattice tower on the Champ de Mars in Paris, "
            "France. It is named after the engineer Gustave Eiffel, whose company designed and "
            "built the tower from 1887 to 1889.")
    ids = Tokenizer.from_gguf(smollm2_gguf).encode(text)
    logits = prefill_logits(smollm2_gguf, ids).astype(np.float64)
    top = logits.max(axis=-1)
    log_z = top + np.log(np.exp(logits - top[:, None]).sum(axis=-1))
    nll = np.mean(log_z[:-1] - logits[np.arange(len(ids) - 1), ids[1:]])
    assert nll < 2.3, nll
