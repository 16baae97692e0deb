"""SmolLM2-135M (the real Q4_1 GGUF) on vulkan: greedy tokens equal the reference backend's.
Whole model through the public API, so marked slow; three tokens and a one-token prefill
chunk (one plan, the decode step, fed the prompt a token at a time) keep it cheap on
lavapipe."""
import pytest

pytestmark = pytest.mark.slow


def test_greedy_tokens_match_the_reference_backend(vulkan_target, smollm2_gguf):
    import poot

    want_model = poot.load(str(smollm2_gguf), backend="reference", max_seq=16,
                           prefill_tokens=1)
    prompt = want_model.tokenize("The capital of France is")
    want = "".join(want_model.generate(prompt, max_tokens=3))
    got_model = poot.load(str(smollm2_gguf), backend="vulkan", max_seq=16, prefill_tokens=1)
    got = "".join(got_model.generate(prompt, max_tokens=3))
    assert got == want
    assert got.startswith(" Paris")
