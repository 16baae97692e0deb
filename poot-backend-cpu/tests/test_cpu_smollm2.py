"""SmolLM2-135M (the real Q4_1 GGUF) on cpu: greedy tokens equal the reference backend's.
Whole model, so marked slow."""
import pytest
from poot.models.greedy import greedy, open_decoder

pytestmark = pytest.mark.slow


def test_greedy_tokens_match_the_reference_backend(cpu_backend, smollm2_gguf):
    from poot.models.tokenizer import Tokenizer

    tok = Tokenizer.from_gguf(smollm2_gguf)
    prompt = tok.encode("The capital of France is")
    step, weights = open_decoder(str(smollm2_gguf), max_seq=len(prompt) + 12)
    want = greedy(step, weights, "reference", prompt, 10)
    got = greedy(step, weights, "cpu", prompt, 10)
    assert got.tokens == want.tokens
    assert tok.decode(got.tokens).startswith(" Paris")


def test_prefill_chunks_then_greedy_text_match_the_reference_backend(cpu_backend, smollm2_gguf):
    """A 40-token prompt: one 32-token prefill chunk (the panel kernel) and a rest, then
    greedy decode; the text equals the reference backend's."""
    import poot

    text = ("The history of the city begins with a small settlement on the river, where "
            "traders met to exchange grain, salt and cloth. ") * 2
    got = {}
    for backend in ("reference", "cpu"):
        model = poot.load(str(smollm2_gguf), backend=backend, max_seq=64)
        ids = model.tokenize(text)[:40]
        assert len(ids) == 40
        got[backend] = "".join(model.generate(ids, max_tokens=12))
    assert got["cpu"] == got["reference"] and got["cpu"].strip()
