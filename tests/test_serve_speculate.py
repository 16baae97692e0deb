"""Speculative decoding in `poot serve` (--speculate lookup, a request's `speculate` and
`prediction` fields), through the openai client, on the fuzzer's tiny Llama (random
weights, a byte vocabulary) on the reference backend: greedy text is the same with and
without speculation, a request's speculation does not change another's text, a prediction
of the answer is accepted and counted in usage, /stats and /metrics count the steps, and
bad values are refused. One server for the module."""
from __future__ import annotations

import subprocess
import sys
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import openai
import pytest
from serve_process import openai_client, serve, tiny_llama

MODEL = "smollm2"
#: a prompt that repeats itself, so that prompt lookup has n-grams to propose from
PROMPT = "the cat sat on the mat. the cat sat on the mat. the cat"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return tiny_llama(tmp_path_factory.mktemp("tiny"), 256)


@pytest.fixture(scope="module")
def server(tiny):
    with serve(tiny, "--max-batch", "4", "--max-seq", "256", "--speculate", "lookup",
               "--draft-tokens", "4") as s:
        yield s


@pytest.fixture(scope="module")
def client(server):
    return openai_client(server)


def complete(client, prompt=PROMPT, max_tokens=40, **extra):
    kw = {k: extra.pop(k) for k in ("temperature", "seed", "logprobs", "stop", "n")
          if k in extra}
    return client.completions.create(model=MODEL, prompt=prompt, max_tokens=max_tokens,
                                     temperature=kw.pop("temperature", 0.0),
                                     extra_body={"ignore_eos": True, **extra}, **kw)


@pytest.mark.parametrize("prompt", ["hello world", "ba", PROMPT])
def test_greedy_text_is_the_same_with_and_without_speculation(client, server, prompt):
    s0 = server.stats()["speculation"]
    plain = complete(client, prompt, speculate=False).choices[0].text
    s1 = server.stats()["speculation"]
    assert s1 == s0                     # speculate: false proposes nothing
    fast = complete(client, prompt)
    assert fast.choices[0].text == plain
    assert fast.usage.completion_tokens == 40
    assert fast.usage.completion_tokens_details is None       # no prediction given
    s2 = server.stats()["speculation"]
    assert s2["accepted"] > s1["accepted"]
    if prompt == "hello world":         # some proposals fail there: rolled back
        assert s2["proposed"] - s1["proposed"] > s2["accepted"] - s1["accepted"]
    streamed = client.completions.create(model=MODEL, prompt=prompt, max_tokens=40,
                                         temperature=0.0, stream=True,
                                         extra_body={"ignore_eos": True})
    assert "".join(c.choices[0].text for c in streamed) == plain


def test_a_prediction_of_the_answer_is_accepted_and_counted(client, server):
    plain = complete(client, speculate=False).choices[0].text
    s0 = server.stats()["speculation"]
    got = complete(client, prediction={"type": "content", "content": plain})
    assert got.choices[0].text == plain
    details = got.usage.completion_tokens_details
    assert details.accepted_prediction_tokens > 0
    s1 = server.stats()["speculation"]
    assert s1["accepted"] - s0["accepted"] == details.accepted_prediction_tokens
    assert s1["proposed"] - s0["proposed"] == \
        details.accepted_prediction_tokens + details.rejected_prediction_tokens
    assert s1["verify_steps"] > s0["verify_steps"]
    # a verification step yields several tokens: fewer steps than tokens
    assert s1["verify_steps"] - s0["verify_steps"] < 39
    assert 0 < s1["acceptance"] <= 1
    # a wrong prediction changes no greedy token, and its tokens count as rejected
    wrong = complete(client, prediction={"type": "content", "content": "zzzz qqqq " * 8})
    assert wrong.choices[0].text == plain
    assert wrong.usage.completion_tokens_details.accepted_prediction_tokens >= 0
    # chat takes it too
    chat = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=20,
        temperature=0.0, extra_body={"ignore_eos": True, "speculate": False})
    text = chat.choices[0].message.content
    again = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=20,
        temperature=0.0, prediction={"type": "content", "content": text},
        extra_body={"ignore_eos": True})
    assert again.choices[0].message.content == text
    assert again.usage.completion_tokens_details.accepted_prediction_tokens > 0


def test_speculation_does_not_change_another_requests_text(client):
    alone = complete(client, "xyz", 30, speculate=False).choices[0].text
    sampled = complete(client, "xyz", 30, speculate=False, temperature=1.0,
                       seed=5).choices[0].text
    plain = complete(client, "hello world", speculate=False).choices[0].text
    with ThreadPoolExecutor(4) as pool:
        beside = [pool.submit(complete, client, "xyz", 30, speculate=False),
                  pool.submit(complete, client, "xyz", 30, speculate=False,
                              temperature=1.0, seed=5),
                  pool.submit(complete, client, "hello world"),
                  pool.submit(complete, client, "hello world",
                              prediction={"type": "content", "content": plain[:20]})]
        texts = [f.result().choices[0].text for f in beside]
    assert texts == [alone, sampled, plain, plain]


def test_a_stop_string_or_max_tokens_ends_a_speculated_answer_where_it_would(client):
    """Tokens a verification step accepted past the end are dropped."""
    plain = complete(client, "hello world", speculate=False).choices[0].text
    stop = plain[20:22]
    cut = complete(client, "hello world", speculate=False, stop=stop).choices[0]
    for kw in ({}, {"prediction": {"type": "content", "content": plain}}):
        got = complete(client, "hello world", stop=stop, **kw).choices[0]
        assert (got.text, got.finish_reason) == (cut.text, cut.finish_reason) == \
            (plain[:plain.index(stop)], "stop")
        short = complete(client, "hello world", 7, **kw)
        assert short.choices[0].text == complete(client, "hello world", 7,
                                                 speculate=False).choices[0].text
        assert (short.usage.completion_tokens, short.choices[0].finish_reason) == (7, "length")
    # n choices: each its own proposer; usage sums their proposals
    two = complete(client, "hello world", 20, n=2,
                   prediction={"type": "content", "content": plain})
    first = complete(client, "hello world", 20, speculate=False).choices[0].text
    assert [c.text for c in two.choices] == [first] * 2
    d = two.usage.completion_tokens_details
    assert d.accepted_prediction_tokens >= 2


def test_a_seeded_sample_repeats_under_speculation_beside_others(client):
    """Its proposal lengths, hence its draws, follow its own acceptance, not the step
    times or its neighbours."""
    a, b = (complete(client, "hello world", temperature=1.0, seed=3).choices[0].text
            for _ in range(2))
    assert a == b and len(a) > 0
    with ThreadPoolExecutor(3) as pool:
        beside = [pool.submit(complete, client, "hello world", temperature=1.0, seed=3),
                  pool.submit(complete, client, "xyz", 30, temperature=0.7, seed=9),
                  pool.submit(complete, client, PROMPT)]
        assert beside[0].result().choices[0].text == a


def test_metrics_count_speculation(client, server):
    complete(client, max_tokens=12)
    stats = server.stats()["speculation"]
    with urllib.request.urlopen(server.url + "/metrics", timeout=30) as r:
        text = r.read().decode()
    for name, key in (("poot_speculative_proposed_tokens_total", "proposed"),
                      ("poot_speculative_accepted_tokens_total", "accepted"),
                      ("poot_speculative_verify_steps_total", "verify_steps")):
        line = next(ln for ln in text.splitlines() if ln.startswith(name + " "))
        assert float(line.split()[1]) >= stats[key] > 0
    assert stats["mode"] == "lookup" and stats["draft_tokens"] == 4


@pytest.mark.parametrize("extra, param", [
    ({"speculate": "yes"}, "speculate"),
    ({"prediction": {"type": "text", "content": "x"}}, "prediction"),
    ({"prediction": {"type": "content", "content": ""}}, "prediction.content"),
    ({"prediction": {"type": "content", "content": 5}}, "prediction.content"),
    ({"prediction": {"type": "content", "content": "x"}, "speculate": False}, "prediction"),
    ({"prediction": {"type": "content", "content": "x"}, "logprobs": 1}, "prediction"),
    ({"speculate": True, "logit_bias": {"5": 1}}, "speculate"),
])
def test_bad_speculation_fields_are_refused(client, extra, param):
    with pytest.raises(openai.BadRequestError) as e:
        complete(client, max_tokens=4, **extra)
    assert e.value.body["param"] == param


def test_serve_refuses_a_draft_model_in_one_line(tiny):
    for mode in ("draft:other.gguf", "self:1"):
        run = subprocess.run([sys.executable, "-m", "poot", "serve", str(tiny), "--speculate",
                              mode], capture_output=True, text=True, timeout=60)
        assert run.returncode != 0
        assert "prompt lookup only" in run.stderr and len(run.stderr.strip().splitlines()) == 1


def test_a_prediction_is_walked_in_order_and_lookup_takes_over():
    from poot.serve.speculation import Prediction

    p = Prediction([1, 2, 3, 9, 1, 2, 4, 5, 6])
    assert p.propose([7, 1, 2, 3], 3, None) == ([9, 1, 2], None)
    # "1 2" occurs twice: the match at or after the last one is taken
    assert p.propose([7, 1, 2, 3, 9, 1, 2], 2, None) == ([4, 5], None)
    # at the prediction's end nothing follows; prompt lookup over the text proposes
    assert p.propose([8, 6, 0, 6], 2, None) == ([0, 6], None)


def test_an_answer_to_the_end_of_the_context_speculates_inside_it(client):
    n = complete(client, PROMPT, 1).usage.prompt_tokens
    plain = complete(client, PROMPT, 256 - n, speculate=False)
    fast = complete(client, PROMPT, 256 - n)
    assert fast.choices[0].text == plain.choices[0].text
    assert fast.usage.completion_tokens == 256 - n


def test_a_server_without_speculate_takes_a_prediction_and_refuses_speculate_true(tiny):
    with serve(tiny, "--max-batch", "2", "--max-seq", "256") as plain_server:
        c = openai_client(plain_server)
        plain = complete(c, "hello world", speculate=False).choices[0].text
        assert complete(c, "hello world").choices[0].text == plain
        assert plain_server.stats()["speculation"]["verify_steps"] == 0
        got = complete(c, "hello world", prediction={"type": "content", "content": plain})
        assert got.choices[0].text == plain
        assert got.usage.completion_tokens_details.accepted_prediction_tokens > 0
        assert plain_server.stats()["speculation"]["mode"] is None
        with pytest.raises(openai.BadRequestError) as e:
            complete(c, "hello world", 4, speculate=True)
        assert e.value.body["param"] == "speculate"
