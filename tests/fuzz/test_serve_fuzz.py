"""`poot serve` under random JSON (hypothesis): no request gets a 5xx, every refusal is an
OpenAI error object, and the server still answers afterwards.

The server runs the fuzzer's tiny Llama (seeds.tiny_llama_gguf, with a chat template) on the
reference backend, so an accepted request costs milliseconds and the run stays under a
minute. Bodies are arbitrary JSON values, and valid requests with fields replaced, added or
dropped (every field either endpoint knows, each given any JSON value), and raw bytes; the
GET endpoints and unknown paths get them too. POOT_SERVE_FUZZ_EXAMPLES sets the number of
requests (default 300; a long run: 5000).
"""
from __future__ import annotations

import http.client
import json
import os
import sys
import time
from pathlib import Path

import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
import seeds  # noqa: E402
from serve_process import serve  # noqa: E402

EXAMPLES = int(os.environ.get("POOT_SERVE_FUZZ_EXAMPLES", "300"))
COMPLETION = {"model": "smollm2", "prompt": "the", "max_tokens": 3, "temperature": 0}
CHAT = {"model": "smollm2", "messages": [{"role": "user", "content": "the"}],
        "max_tokens": 3}
FIELDS = sorted({"model", "prompt", "messages", "max_tokens", "max_completion_tokens",
                 "temperature", "top_p", "top_k", "repetition_penalty", "seed", "stop",
                 "stream", "stream_options", "ignore_eos", "user", "n", "frequency_penalty",
                 "presence_penalty", "logit_bias", "logprobs", "top_logprobs", "echo",
                 "best_of", "suffix", "response_format", "tools", "tool_choice",
                 "parallel_tool_calls", "speculate", "prediction"})
#: values each field accepts, so that a mutated body often passes its other checks and
#: reaches the engine (streams, sampling, stops) rather than stopping at the first refusal
GOOD = {"temperature": [0, 0.7, 2], "top_p": [0.5, 1], "top_k": [0, 3, -1], "seed": [0, 7],
        "stop": ["e", ["a", "b"]], "stream": [True, False],
        "stream_options": [{"include_usage": True}], "ignore_eos": [True, False],
        "user": ["u"], "n": [1, 2], "logit_bias": [{}, {"5": 3}],
        "tools": [[], [{"type": "function", "function": {"name": "f", "parameters": {
            "type": "object", "properties": {"a": {"type": "boolean"}}}}}]],
        "tool_choice": ["none", "auto", "required"],
        "max_tokens": [1, 5, 40], "max_completion_tokens": [2], "repetition_penalty": [1.3],
        "response_format": [{"type": "text"}, {"type": "json_object"}],
        "frequency_penalty": [0], "echo": [False], "top_logprobs": [2],
        "prompt": ["the in", [5, 6, 7], ["he"]], "logprobs": [False, True, 2], "best_of": [1],
        "speculate": [True, False], "prediction": [{"type": "content", "content": "the in"}]}
POST = ["/v1/completions", "/v1/chat/completions"]
GET = ["/v1/models", "/health", "/ready", "/stats"]

scalars = (st.none() | st.booleans() | st.integers(-2 ** 70, 2 ** 70)
           | st.sampled_from([0, 1, -1, 2, 64, 65, 10 ** 9, 2 ** 64, 2 ** 64 - 1])
           | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=12)
           | st.sampled_from(["", "smollm2", "user", "system", "text", "none", "auto",
                              "\ud800", "x" * 300]))
values = st.recursive(scalars, lambda kids: st.lists(kids, max_size=4)
                      | st.dictionaries(st.sampled_from(FIELDS) | st.text(max_size=6), kids,
                                        max_size=4), max_leaves=10)
messages = st.lists(st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "assistant", "system", "developer"]) | values,
     "content": st.text(max_size=20) | values}), min_size=0, max_size=3)


@st.composite
def mutated(draw, base: dict):
    body = dict(base)
    for key in draw(st.lists(st.sampled_from(list(base)), max_size=2)):
        body.pop(key, None)
    for key in draw(st.lists(st.sampled_from(FIELDS), max_size=3)):
        good = st.sampled_from(GOOD.get(key, [None]))
        body[key] = draw(st.one_of(good, good, values))
    if "messages" in body and draw(st.booleans()):
        body["messages"] = draw(messages)
    return body


def bodies(path: str):
    base = COMPLETION if path == "/v1/completions" else CHAT
    return st.one_of(mutated(base), mutated(base), values.map(lambda v: v),
                     st.binary(max_size=40))


posts = st.sampled_from(POST).flatmap(
    lambda p: st.tuples(st.just("POST"), st.just(p), bodies(p)))
requests = st.one_of(
    posts, posts, posts, posts, posts,
    st.tuples(st.just("GET"), st.sampled_from(GET), values),
    st.tuples(st.sampled_from(["GET", "POST", "PUT"]),
              st.sampled_from(["/", "/v1", "/v1/embeddings", "/v1/completions/x"]), values))


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    model = seeds.tiny_llama_gguf(tmp_path_factory.mktemp("tiny") / "tiny.gguf")
    with serve(model, "--max-batch", "2", "--max-seq", str(seeds.CTX), "--speculate", "lookup",
               startup_s=120) as s:
        # GET /ready answers 503 while warming, which the fuzzer would take for a fault
        deadline = time.monotonic() + 120
        while send(s, "GET", "/ready", None)[0] != 200 and time.monotonic() < deadline:
            time.sleep(0.1)
        yield s


def send(server, method: str, path: str, body) -> tuple[int, bytes]:
    host, port = server.url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    try:
        raw = body if isinstance(body, bytes) else json.dumps(body).encode()
        conn.request(method, path, body=raw, headers={"content-type": "application/json"})
        r = conn.getresponse()
        return r.status, r.read()
    finally:
        conn.close()


def check(server, method: str, path: str, body) -> None:
    """One request: any status below 500; a refusal is an OpenAI error object; a stream
    ends with [DONE]."""
    status, raw = send(server, method, path, body)
    assert status < 500, (status, raw[:500], server.log[-20:])
    if status >= 400:
        err = json.loads(raw)["error"]
        assert isinstance(err["message"], str) and err["message"]
        assert set(err) == {"message", "type", "param", "code"}
    elif raw.startswith(b"data: "):
        assert raw.rstrip().endswith(b"data: [DONE]"), raw[-200:]
    else:
        json.loads(raw)


def test_random_json_gets_no_5xx_and_the_server_still_answers(server):
    @settings(max_examples=EXAMPLES, deadline=None, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(request=requests)
    def random_requests(request):
        check(server, *request)

    random_requests()
    assert send(server, "GET", "/health", None)[0] == 200
    for path, body in zip(POST, (COMPLETION, CHAT), strict=True):
        status, raw = send(server, "POST", path, body)
        assert status == 200, raw
        assert json.loads(raw)["usage"]["completion_tokens"] >= 1
    stats = json.loads(send(server, "GET", "/stats", None)[1])
    assert stats["active"] == 0 and stats["failed"] == 0


@pytest.mark.parametrize("path, body", [
    ("/v1/chat/completions", {**CHAT, "tools": []}),
    ("/v1/completions", {**COMPLETION, "logit_bias": {}}),
    ("/v1/chat/completions", {**CHAT, "tool_choice": "auto"}),
    ("/v1/completions", {**COMPLETION, "n": 1.0, "echo": False}),
])
def test_values_that_change_nothing_are_accepted(server, path, body):
    status, raw = send(server, "POST", path, body)
    assert status == 200, raw


@pytest.mark.parametrize("path, body, param", [
    ("/v1/completions", {**COMPLETION, "logit_bias": {"5": 1000}}, "logit_bias"),
    ("/v1/chat/completions", {**CHAT, "tools": [{"type": "function"}]}, "tools"),
    ("/v1/chat/completions", {**CHAT, "tool_choice": {"type": "function"}}, "tool_choice"),
    ("/v1/completions", {**COMPLETION, "echo": [True]}, "echo"),
    ("/v1/completions", {**COMPLETION, "logprobs": {"a": 1}}, "logprobs"),
    ("/v1/completions", {**COMPLETION, "frequency_penalty": [0]}, "frequency_penalty"),
    ("/v1/completions", {**COMPLETION, "presence_penalty": True}, "presence_penalty"),
    ("/v1/completions", {**COMPLETION, "n": True}, "n"),
    ("/v1/chat/completions", {**CHAT, "messages": [{"role": ["user"], "content": "x"}]},
     "messages[0].role"),
    ("/v1/completions", {**COMPLETION, "prompt": "\ud800"}, "prompt"),
    ("/v1/completions", {**COMPLETION, "temperature": 10 ** 400}, "temperature"),
])
def test_unsupported_values_of_any_json_type_are_typed_400s(server, path, body, param):
    status, raw = send(server, "POST", path, body)
    assert status == 400, raw
    err = json.loads(raw)["error"]
    assert err["type"] == "invalid_request_error" and err["param"] == param, err


def test_a_request_without_max_tokens_gets_the_documented_default(server):
    body = {k: v for k, v in COMPLETION.items() if k != "max_tokens"}
    status, raw = send(server, "POST", "/v1/completions", {**body, "ignore_eos": True})
    assert status == 200, raw
    assert json.loads(raw)["usage"]["completion_tokens"] == 16      # OpenAI's default


def test_a_chat_without_max_tokens_stops_at_the_end_of_the_context(server):
    body = {**{k: v for k, v in CHAT.items() if k != "max_tokens"}, "ignore_eos": True}
    status, raw = send(server, "POST", "/v1/chat/completions", body)
    assert status == 200, raw
    use = json.loads(raw)["usage"]
    assert use["prompt_tokens"] + use["completion_tokens"] == seeds.CTX    # under the 1024
