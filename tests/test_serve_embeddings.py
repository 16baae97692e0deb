"""POST /v1/embeddings of `poot serve` through the openai client, on the fuzzer's tiny Llama:
each vector is the final hidden state at the input's last token, unit length, checked
against the numpy reference decoder (tests/reference_llama.py: the hidden state recovered
from its logits through the tied embedding); floats and base64 agree; a long input spans
prefill chunks; the server streams an answer beside them; refusals are 400s."""
from __future__ import annotations

import base64
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import openai
import pytest
import reference_llama
from serve_process import openai_client, serve, tiny_llama

sys.path.insert(0, str(Path(__file__).parent / "fuzz"))
import seeds  # noqa: E402

MODEL = "smollm2"
TEXTS = ["the cat", "a longer input that takes more than one prefill chunk of the model " * 3,
         "x"]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """The tiny model's file, its server and a client of it."""
    tiny = tiny_llama(tmp_path_factory.mktemp("tiny"), 256)
    with serve(tiny, "--max-batch", "2", "--max-seq", "256") as server:
        yield tiny, server, openai_client(server)


@pytest.fixture(scope="module")
def tiny(served) -> Path:
    return served[0]


@pytest.fixture(scope="module")
def client(served):
    return served[2]


def ids_of(tiny: Path, text: str) -> list[int]:
    from poot.models.tokenizer import Tokenizer

    return Tokenizer.from_gguf(tiny).encode(text)


def expected(tiny: Path, text: str) -> np.ndarray:
    """The reference's final hidden state at the last token, unit length: its logits are
    that state times the tied embedding, which has full column rank."""
    ids = ids_of(tiny, text)
    logits = reference_llama.prefill_logits(tiny, ids)[-1].astype(np.float64)
    table = seeds.llama_tensors(len(seeds.byte_vocab()[0]))["token_embd.weight"]
    hidden = np.linalg.lstsq(table.astype(np.float64), logits, rcond=None)[0]
    return hidden / np.linalg.norm(hidden)


def test_vectors_are_the_last_tokens_hidden_state(tiny, client):
    got = client.embeddings.create(model=MODEL, input=TEXTS)
    assert [d.index for d in got.data] == [0, 1, 2]
    assert got.usage.prompt_tokens == sum(len(ids_of(tiny, t)) for t in TEXTS)
    for text, d in zip(TEXTS, got.data):
        v = np.asarray(d.embedding)
        assert v.shape == (seeds.DIM,)
        assert np.linalg.norm(v) == pytest.approx(1.0, abs=1e-5)
        np.testing.assert_allclose(v, expected(tiny, text), atol=2e-4)
    one = client.embeddings.create(model=MODEL, input=TEXTS[0])
    assert one.data[0].embedding == got.data[0].embedding


def test_base64_holds_the_same_floats(client):
    floats = client.embeddings.create(model=MODEL, input="the cat").data[0].embedding
    raw = client.embeddings.with_raw_response.create(model=MODEL, input="the cat",
                                                     encoding_format="base64")
    packed = raw.http_response.json()["data"][0]["embedding"]
    decoded = np.frombuffer(base64.b64decode(packed), "<f4")
    np.testing.assert_array_equal(decoded, np.asarray(floats, np.float32))


def test_embeddings_run_beside_a_stream(served, client):
    def stream():
        return "".join(c.choices[0].text for c in client.completions.create(
            model=MODEL, prompt="abc", max_tokens=40, temperature=0, stream=True,
            extra_body={"ignore_eos": True}))

    with ThreadPoolExecutor(2) as pool:
        text = pool.submit(stream)
        vectors = [client.embeddings.create(model=MODEL, input=t) for t in TEXTS]
        assert len(text.result()) > 0
    assert all(len(v.data[0].embedding) == seeds.DIM for v in vectors)
    stats = served[1].wait_idle()
    assert stats["embedded_inputs"] >= 4 and stats["free_blocks"] == stats["pool_blocks"]


@pytest.mark.parametrize("kw", [
    {"input": ""}, {"input": []}, {"input": [[]]}, {"input": [1, 10 ** 6]},
    {"input": "x" * 300}, {"input": "a", "dimensions": 8}, {"input": {"a": 1}},
])
def test_bad_inputs_are_400s(client, kw):
    with pytest.raises(openai.BadRequestError) as err:
        client.embeddings.create(model=MODEL, **kw)
    assert err.value.body["type"] == "invalid_request_error"
