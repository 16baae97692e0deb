"""`poot serve` refuses bad requests with OpenAI error objects and keeps serving; a client
that leaves mid-stream frees its KV blocks; a full queue answers 429 (one small server:
one batch row, one queue place)."""
from __future__ import annotations

import http.client
import json
import time
from urllib.parse import urlsplit

import openai
import pytest
from serve_process import serve

pytestmark = pytest.mark.slow

GOOD = {"model": "smollm2", "prompt": "The capital of France is", "max_tokens": 1,
        "temperature": 0}
LONG_PROMPT = " ".join(["word"] * 80)  # more tokens than the server's 64 positions


@pytest.fixture(scope="module")
def server(smollm2_gguf):
    with serve(smollm2_gguf, "--max-batch", "1", "--max-queue", "1", "--max-seq", "64") as s:
        yield s


class Reply:
    def __init__(self, status: int, text: str, headers=None):
        self.status_code, self.text, self.headers = status, text, headers

    def json(self):
        return json.loads(self.text)


def connect(server) -> http.client.HTTPConnection:
    u = urlsplit(server.url)
    return http.client.HTTPConnection(u.hostname, u.port, timeout=120)


def send(conn, path: str, body) -> http.client.HTTPResponse:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    conn.request("POST", "/v1" + path, body=content,
                 headers={"content-type": "application/json"})
    return conn.getresponse()


def post(server, path, body) -> Reply:
    conn = connect(server)
    try:
        r = send(conn, path, body)
        return Reply(r.status, r.read().decode(), r.headers)
    finally:
        conn.close()


BAD = [
    ("malformed json", "/completions", b'{"model": "smollm2", "prompt": ', 400, None),
    ("not an object", "/completions", [1, 2], 400, None),
    ("wrong type", "/completions", {**GOOD, "temperature": "hot"}, 400, "temperature"),
    ("bool as int", "/completions", {**GOOD, "max_tokens": True}, 400, "max_tokens"),
    ("max_tokens 0", "/completions", {**GOOD, "max_tokens": 0}, 400, "max_tokens"),
    ("max_tokens < 0", "/chat/completions",
     {"model": "smollm2", "messages": [{"role": "user", "content": "hi"}], "max_tokens": -3},
     400, "max_tokens"),
    ("prompt too long", "/completions", {**GOOD, "prompt": LONG_PROMPT}, 400, "prompt"),
    ("answer too long", "/completions", {**GOOD, "max_tokens": 1000}, 400, "max_tokens"),
    ("unknown model", "/completions", {**GOOD, "model": "gpt-4o"}, 404, "model"),
    ("unknown field", "/completions", {**GOOD, "temprature": 0}, 400, "temprature"),
    ("no prompt", "/completions", {"model": "smollm2"}, 400, "prompt"),
    ("bad messages", "/chat/completions", {"model": "smollm2", "messages": "hi"}, 400,
     "messages"),
    ("bad role", "/chat/completions",
     {"model": "smollm2", "messages": [{"role": "wizard", "content": "hi"}]}, 400,
     "messages[0].role"),
    ("n > 16", "/completions", {**GOOD, "n": 17}, 400, "n"),
    ("top_p 0", "/completions", {**GOOD, "top_p": 0}, 400, "top_p"),
    ("token id out of vocabulary", "/completions", {**GOOD, "prompt": [1, 10**9]}, 400,
     "prompt"),
]


@pytest.mark.parametrize("what,path,body,status,param", BAD, ids=[b[0] for b in BAD])
def test_bad_input_gets_its_4xx_and_the_server_goes_on(server, what, path, body, status,
                                                        param):
    r = post(server, path, body)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["message"] and err["type"] == "invalid_request_error"
    assert err["param"] == param
    ok = post(server, "/completions", GOOD)
    assert ok.status_code == 200 and ok.json()["choices"][0]["text"] == " Paris"


def test_openai_client_sees_the_error_objects(server):
    client = openai.OpenAI(base_url=server.base, api_key="unused", max_retries=0)
    with pytest.raises(openai.NotFoundError) as info:
        client.completions.create(model="nope", prompt="hi", max_tokens=1)
    assert info.value.code == "model_not_found"
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model="smollm2", prompt=LONG_PROMPT, max_tokens=1)
    assert info.value.code == "context_length_exceeded"


def open_stream(server, max_tokens=40):
    """A streaming request held open once its first token arrived; returns its
    connection and response."""
    conn = connect(server)
    r = send(conn, "/completions",
             {**GOOD, "max_tokens": max_tokens, "stream": True, "ignore_eos": True})
    assert r.status == 200
    next_event(r)
    return conn, r


def next_event(r) -> bytes:
    while not (line := r.readline()).startswith(b"data: "):
        assert line, "the stream ended"
    return line


def test_a_client_that_leaves_mid_stream_frees_its_blocks(server):
    start = server.wait_idle()
    conn, r = open_stream(server)
    next_event(r)
    busy = server.stats()
    assert busy["active"] == 1 and busy["free_blocks"] < start["free_blocks"]
    conn.close()
    after = server.wait_idle()
    assert after["free_blocks"] == start["free_blocks"]
    assert after["cancelled"] == start["cancelled"] + 1
    assert after["generated_tokens"] - start["generated_tokens"] < 40


def test_a_full_queue_answers_429_and_recovers(server):
    start = server.wait_idle()
    running, _ = open_stream(server)                 # holds the one batch row
    queued = connect(server)
    queued.request("POST", "/v1/completions", body=json.dumps({**GOOD, "stream": True}),
                   headers={"content-type": "application/json"})
    deadline = time.monotonic() + 60
    while server.stats()["queued"] < 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    r = post(server, "/completions", GOOD)
    assert r.status_code == 429, r.text
    assert r.json()["error"]["code"] == "server_busy"
    assert r.headers["retry-after"].isdigit()
    running.close()
    queued.close()
    after = server.wait_idle()
    assert after["free_blocks"] == start["free_blocks"]
    assert after["rejected"] == start["rejected"] + 1
    assert post(server, "/completions", GOOD).json()["choices"][0]["text"] == " Paris"
