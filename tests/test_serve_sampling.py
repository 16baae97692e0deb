"""The OpenAI sampling fields of `poot serve`, through the openai client, on the fuzzer's tiny
Llama (random weights, a byte vocabulary: every character is a token) on the reference
backend: `seed`, `stop`, `stream_options.include_usage`, `usage.prompt_tokens_details
.cached_tokens`, `n`, `logprobs` / `top_logprobs` (checked against the model's own logits)
and `logit_bias`. One server for the module."""
from __future__ import annotations

import math
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import openai
import pytest
from serve_process import openai_client, serve, tiny_llama

sys.path.insert(0, str(Path(__file__).parent / "fuzz"))
import seeds  # noqa: E402

MODEL = "smollm2"
PROMPT = "abc"            # whose greedy answer is printable ASCII
SYSTEM = "You answer in the voice of a lighthouse keeper on a windy northern island. " * 2


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return tiny_llama(tmp_path_factory.mktemp("tiny"), 256)


@pytest.fixture(scope="module")
def server(tiny):
    with serve(tiny, "--max-batch", "4", "--max-seq", "256") as s:
        yield s


@pytest.fixture(scope="module")
def client(server):
    return openai_client(server)


def complete(client, **kw):
    kw = {"model": MODEL, "prompt": PROMPT, "max_tokens": 12, **kw}
    kw.setdefault("extra_body", {"ignore_eos": True})
    return client.completions.create(**kw)


def test_a_seed_reproduces_its_sample_and_another_seed_differs(client):
    a, b, c = (complete(client, temperature=1.0, seed=s).choices[0].text for s in (7, 7, 8))
    assert a == b and a != c
    streamed = complete(client, temperature=1.0, seed=7, stream=True)
    assert "".join(ch.choices[0].text for ch in streamed) == a
    # in a batch beside other requests, and drawn on the host (logprobs): the same draws
    with ThreadPoolExecutor(3) as pool:
        batched = [pool.submit(complete, client, temperature=1.0, seed=s, **kw)
                   for s, kw in ((7, {}), (8, {}), (7, {"logprobs": 1}))]
        texts = [f.result().choices[0].text for f in batched]
    assert texts == [a, c, a]


def test_a_stop_string_ends_the_answer_before_it(client):
    greedy = complete(client, temperature=0, max_tokens=24).choices[0].text
    at = next(i for i, ch in enumerate(greedy) if i >= 1 and ch.isascii() and ch.isprintable())
    stop = greedy[at]
    got = complete(client, temperature=0, max_tokens=24, stop=["\u2603never", stop])
    assert got.choices[0].text == greedy[: greedy.index(stop)]
    assert got.choices[0].finish_reason == "stop"
    streamed = list(complete(client, temperature=0, max_tokens=24, stop=stop, stream=True))
    assert "".join(ch.choices[0].text for ch in streamed) == got.choices[0].text
    assert streamed[-1].choices[0].finish_reason == "stop"


def test_include_usage_adds_a_last_usage_chunk(client):
    whole = complete(client, temperature=0)
    plain = list(complete(client, temperature=0, stream=True))
    assert all(ch.usage is None for ch in plain)
    counted = list(complete(client, temperature=0, stream=True,
                            stream_options={"include_usage": True}))
    assert counted[-1].choices == []
    assert counted[-1].usage.total_tokens == whole.usage.total_tokens
    assert counted[-1].usage.completion_tokens == 12


def test_cached_tokens_count_the_prompt_read_from_the_prefix_cache(client):
    messages = [{"role": "system", "content": SYSTEM},
                {"role": "user", "content": "what do you see?"}]
    first, second = (client.chat.completions.create(model=MODEL, messages=messages,
                                                    max_tokens=2, temperature=0)
                     for _ in range(2))
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert cached % 16 == 0 and second.usage.prompt_tokens - 16 <= cached < \
        second.usage.prompt_tokens


def test_n_choices_differ_share_the_prompt_and_choice_0_is_the_seeds(server, client):
    before = server.wait_idle()["cached_prompt_tokens"]
    prompt = "a long prompt that fills a few blocks of the KV pool, " * 2
    got = complete(client, prompt=prompt, temperature=1.0, seed=11, n=3)
    texts = [c.text for c in sorted(got.choices, key=lambda c: c.index)]
    assert [c.index for c in sorted(got.choices, key=lambda c: c.index)] == [0, 1, 2]
    assert len(set(texts)) == 3
    assert texts[0] == complete(client, prompt=prompt, temperature=1.0, seed=11).choices[0].text
    assert got.usage.completion_tokens == 3 * 12
    # choices 1 and 2 started with the cached blocks of choice 0's prompt
    shared = server.wait_idle()["cached_prompt_tokens"] - before
    assert shared >= 2 * (got.usage.prompt_tokens // 16) * 16 > 0
    chunks = list(complete(client, prompt=prompt, temperature=1.0, seed=11, n=3, stream=True,
                           stream_options={"include_usage": True}))
    streamed = ["".join(ch.choices[0].text for ch in chunks if ch.choices and
                        ch.choices[0].index == i) for i in range(3)]
    assert streamed == texts
    assert chunks[-1].usage.completion_tokens == 3 * 12


def log_softmax(z: np.ndarray) -> np.ndarray:
    z = z.astype(np.float64)
    return z - (z.max() + np.log(np.exp(z - z.max()).sum()))


@pytest.fixture(scope="module")
def first_logprobs(tiny) -> np.ndarray:
    """log-softmax of the model's logits after PROMPT, computed here."""
    from poot.models.runner import load

    model = load(tiny, "reference", max_seq=256)
    logits = np.asarray(model.prefill_logits(model.tokenize(PROMPT)))
    return log_softmax(logits.reshape(-1, logits.shape[-1])[-1])   # after the last token


def test_logprobs_are_the_models_and_greedy_takes_the_best(client, first_logprobs):
    plain = complete(client, temperature=0).choices[0].text
    c = complete(client, temperature=0, logprobs=3).choices[0]
    assert c.text == plain                       # the host's draw is the graph's
    lp = c.logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 12
    assert "".join(lp.tokens) == c.text
    for token, logprob, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
        assert len(top) == 3 and max(top.values()) == logprob and top[token] == logprob
    best = np.argsort(-first_logprobs, kind="stable")[:3]
    assert math.isclose(lp.token_logprobs[0], first_logprobs[best[0]], abs_tol=1e-4)
    assert sorted(lp.top_logprobs[0].values(), reverse=True) == pytest.approx(
        first_logprobs[best], abs=1e-4)


def test_chat_logprobs_in_whole_and_streamed_answers(client):
    messages = [{"role": "user", "content": "hello there"}]
    kw = dict(model=MODEL, messages=messages, max_tokens=8, temperature=0,
              extra_body={"ignore_eos": True}, logprobs=True, top_logprobs=2)
    whole = client.chat.completions.create(**kw).choices[0]
    content = whole.logprobs.content
    assert len(content) == 8
    assert b"".join(bytes(e.bytes) for e in content).decode("utf-8", "replace") == \
        whole.message.content
    for e in content:
        assert e.logprob <= 0 and len(e.top_logprobs) == 2
        assert e.top_logprobs[0].logprob >= e.top_logprobs[1].logprob
        assert e.top_logprobs[0].logprob == e.logprob
    chunks = list(client.chat.completions.create(**kw, stream=True))
    streamed = [e for ch in chunks if ch.choices and ch.choices[0].logprobs
                for e in ch.choices[0].logprobs.content]
    # the second request finds its prompt in the prefix cache, so its prefill multiplies
    # fewer rows: BLAS may sum them in another order (it does on AMD Zen), which moves a
    # logprob by f32 rounding and nothing more
    assert [e.token for e in streamed] == [e.token for e in content]
    assert [e.logprob for e in streamed] == pytest.approx([e.logprob for e in content],
                                                         rel=1e-6, abs=1e-6)
    without = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=2)
    assert without.choices[0].logprobs is None


def test_logit_bias_forces_and_forbids_tokens(client):
    forced = complete(client, temperature=0, logit_bias={str(seeds_id("Z")): 100})
    assert set(forced.choices[0].text) == {"Z"}, forced.choices[0].text
    greedy = complete(client, temperature=0, max_tokens=1).choices[0].text
    tok = complete(client, temperature=0, max_tokens=1, logprobs=0).choices[0]
    banned = tok.logprobs.tokens[0]
    assert banned == greedy
    other = complete(client, temperature=0, max_tokens=1,
                     logit_bias={str(seeds_id(banned)): -100})
    assert other.choices[0].text != greedy


def seeds_id(token: str) -> int:
    """The id of a one-character token of the tiny vocabulary."""
    from poot.models.tokenizer import gpt2_unicode_to_byte

    tokens = seeds.byte_vocab()[0]
    table = {b: ch for ch, b in gpt2_unicode_to_byte().items()}
    return tokens.index(table[token.encode()[0]])


@pytest.mark.parametrize("path, body, param", [
    ("completions", {"prompt": "a", "n": 17}, "n"),
    ("completions", {"prompt": "a", "logprobs": 6}, "logprobs"),
    ("completions", {"prompt": "a", "logit_bias": {"99999": 1}}, "logit_bias"),
    ("completions", {"prompt": "a", "logit_bias": {"5": 101}}, "logit_bias"),
    ("completions", {"prompt": "a", "logit_bias": {"x": 1}}, "logit_bias"),
    ("chat", {"top_logprobs": 2}, "top_logprobs"),
    ("chat", {"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
])
def test_out_of_range_fields_are_400s(client, path, body, param):
    if path == "chat":
        call = client.chat.completions.create
        body = {"messages": [{"role": "user", "content": "a"}], **body}
    else:
        call = client.completions.create
    known = {k: body.pop(k) for k in list(body) if k in ("prompt", "messages", "n")}
    with pytest.raises(openai.BadRequestError) as err:
        call(model=MODEL, max_tokens=2, **known, extra_body=body)
    assert err.value.body["param"] == param



def test_logprobs_name_a_padded_vocabulary_row_without_text():
    """The model's vocabulary may be padded past the tokenizer's (as real checkpoints pad
    to a multiple of 64 or 128): such a row in the logprobs has no text and no bytes."""
    from types import SimpleNamespace

    from poot.serve.logits import LogitRule

    tok = SimpleNamespace(token_bytes=[b"a", b"b"], tokens=["a", "b"], special_ids=set())
    rule = LogitRule(tok, top=3)
    z = np.array([0.0, 1.0, 2.0, 3.0], np.float32)        # rows 2 and 3: padding
    out = rule.chosen(z, 3)
    assert (out["token"], out["bytes"]) == ("", [])
    assert [e["token"] for e in out["top_logprobs"]] == ["", "", "b"]
