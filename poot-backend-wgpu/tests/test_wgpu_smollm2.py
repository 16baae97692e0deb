"""SmolLM2-135M (the real Q4_1 GGUF) on wgpu: a short greedy generation gives the reference
backend's tokens. Whole model, so marked slow."""
import pytest
from poot.models.greedy import greedy, open_decoder

pytestmark = pytest.mark.slow


def test_greedy_tokens_match_the_reference_backend(wgpu_device, smollm2_gguf):
    from poot.models.tokenizer import Tokenizer

    tok = Tokenizer.from_gguf(smollm2_gguf)
    prompt = tok.encode("The capital of France is")
    step, weights = open_decoder(str(smollm2_gguf), max_seq=len(prompt) + 4)
    want = greedy(step, weights, "reference", prompt, 3)
    got = greedy(step, weights, "wgpu", prompt, 3)
    assert got.tokens == want.tokens
    assert tok.decode(got.tokens).startswith(" Paris")
