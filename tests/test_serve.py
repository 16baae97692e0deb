"""`poot serve` with the real SmolLM2 on the compiled cpu backend, through the openai client:
completions and chat, whole and streamed; 16 concurrent greedy requests answer exactly what
each answers alone, and the KV pool is whole again afterwards. (The server's scheduling is
the same on every backend; the reference backend serves in tests/test_serve_refusals.py and
the tiny-model server tests, and agrees with cpu on SmolLM2's text in
poot-core/tests/test_precision_models.py.)"""
from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest
from serve_process import serve

pytestmark = pytest.mark.slow

PROMPTS = [
    "The capital of France is", "One, two, three,", "Once upon a time, there was a",
    "def fibonacci(n):", "The sun rises in the", "My favourite colour is",
    "Water boils at", "The quick brown fox", "In 1492, Columbus", "A haiku about rain:",
    "The largest planet in our solar system is", "To make a cup of tea, first",
    "Python is a programming language that", "The opposite of hot is",
    "Here is a list of the days of the week, in order, starting from the first working day "
    "and written out in full without abbreviations: Monday, Tuesday, Wednesday,",
    "The chemical symbol for gold is",
]


@pytest.fixture(scope="module")
def server(smollm2_gguf):
    with serve(smollm2_gguf, "--backend", "cpu", "--max-batch", "16", "--max-seq", "128",
               "--max-queue", "32", "--prefill-chunk", "16") as s:
        yield s


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.base, api_key="unused", max_retries=0, timeout=300)


def test_models_and_health(server, client):
    assert [m.id for m in client.models.list().data] == ["smollm2"]
    assert server.stats()["pool_blocks"] == 16 * 128 // 16


def test_completion_whole_and_streamed(client):
    whole = client.completions.create(model="smollm2", prompt="The capital of France is",
                                      max_tokens=6, temperature=0)
    choice = whole.choices[0]
    assert choice.text.startswith(" Paris")
    assert choice.finish_reason == "length"
    assert (whole.usage.prompt_tokens, whole.usage.completion_tokens) == (5, 6)
    chunks = list(client.completions.create(model="smollm2", prompt="The capital of France is",
                                            max_tokens=6, temperature=0, stream=True))
    assert "".join(c.choices[0].text for c in chunks) == choice.text
    assert chunks[-1].choices[0].finish_reason == "length"


def test_stop_string_ends_the_answer_before_it(client):
    got = client.completions.create(model="smollm2", prompt="The capital of France is",
                                    max_tokens=10, temperature=0, stop=["."])
    assert got.choices[0].text == " Paris"
    assert got.choices[0].finish_reason == "stop"


def test_chat_whole_and_streamed(client):
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    whole = client.chat.completions.create(model="smollm2", messages=messages, max_tokens=8,
                                           temperature=0)
    msg = whole.choices[0].message
    assert msg.role == "assistant" and "Paris" in msg.content
    chunks = list(client.chat.completions.create(
        model="smollm2", messages=messages, max_tokens=8, temperature=0, stream=True,
        stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == msg.content
    assert chunks[-1].choices == [] and chunks[-1].usage.total_tokens == whole.usage.total_tokens


def test_16_concurrent_greedy_requests_answer_as_alone(server, client):
    start = server.wait_idle()
    lengths = [3 + i % 6 for i in range(len(PROMPTS))]

    def ask(i):
        r = client.completions.create(model="smollm2", prompt=PROMPTS[i],
                                      max_tokens=lengths[i], temperature=0)
        return r.choices[0].text, r.choices[0].finish_reason, r.usage.completion_tokens

    alone = [ask(i) for i in range(len(PROMPTS))]
    before = server.stats()
    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        together = list(pool.map(ask, range(len(PROMPTS))))
    after = server.wait_idle()
    assert together == alone
    assert after["finished"] - before["finished"] == len(PROMPTS)
    assert after["free_blocks"] == start["free_blocks"] == start["pool_blocks"]
    # the answers were decoded together: far fewer steps than tokens, several rows a step
    steps = after["steps"] - before["steps"]
    tokens = after["generated_tokens"] - before["generated_tokens"]
    assert steps < tokens / 2, (steps, tokens)
    assert after["peak_batch"] >= 4


def test_greedy_rows_beside_a_sampled_one_answer_as_alone(server, client):
    """A step of greedy rows only runs the argmax plan, one with a sampled row the full
    sampler (both ran here: the greedy requests alone, the sampled one alone): neither
    changes any answer, the seeded draw's included."""
    def ask(i):
        sampled = i == 4
        r = client.completions.create(model="smollm2", prompt=PROMPTS[i], max_tokens=5,
                                      temperature=0.8 if sampled else 0,
                                      seed=11 if sampled else None)
        return r.choices[0].text

    before = server.stats()
    alone = [ask(i) for i in range(5)]
    with ThreadPoolExecutor(5) as pool:
        together = list(pool.map(ask, range(5)))
    after = server.wait_idle()
    assert together == alone
    argmax = after["argmax_steps"] - before["argmax_steps"]
    assert 0 < argmax < after["steps"] - before["steps"]


def test_plans_are_made_after_the_server_listens(server):
    """The server listens before it plans (the startup line first); a turn makes the plan
    it needs and the idle loop the rest, until every batch size has its plans."""
    deadline = time.monotonic() + 300
    while (s := server.stats())["plans_waiting"] and time.monotonic() < deadline:
        time.sleep(0.5)
    assert s["plans_waiting"] == 0
    assert s["plans_made"] == 2 * len(s["decode_batches"]) + len(s["prefill_batches"])
    log = "".join(server.log)
    assert log.index("[poot] serving smollm2") < log.index("[poot] planned and ran")
