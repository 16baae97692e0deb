"""`poot serve --api-key KEY` (or $POOT_API_KEY): every /v1 route wants `Authorization:
Bearer KEY` and answers 401 in the OpenAI error shape without it; /health, /ready and
/metrics stay open. On the fuzzer's tiny Llama."""
from __future__ import annotations

import json
import sys
import urllib.error
import urllib.request
from pathlib import Path

import openai
import pytest
from serve_process import serve

sys.path.insert(0, str(Path(__file__).parent / "fuzz"))
import seeds  # noqa: E402

KEY = "sk-poot-test-7f3a"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return seeds.tiny_llama_gguf(tmp_path_factory.mktemp("tiny") / "tiny.gguf")


def get(url: str, headers=None) -> tuple[int, dict | str]:
    req = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            status, raw, kind = r.status, r.read(), r.headers.get("Content-Type", "")
    except urllib.error.HTTPError as exc:
        status, raw, kind = exc.code, exc.read(), exc.headers.get("Content-Type", "")
    return status, json.loads(raw) if kind.startswith("application/json") else raw.decode()


def client(server, key):
    return openai.OpenAI(base_url=server.base, api_key=key, max_retries=0, timeout=120)


def check_auth(server, key: str) -> None:
    with pytest.raises(openai.AuthenticationError) as exc:
        client(server, "wrong").chat.completions.create(
            model="smollm2", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    assert exc.value.status_code == 401
    assert exc.value.body["code"] == "invalid_api_key"
    assert exc.value.body["type"] == "invalid_request_error"
    for path in ("/v1/models", "/v1/completions", "/v1/nothing-here"):
        status, body = get(server.url + path)
        assert status == 401 and body["error"]["code"] == "invalid_api_key", path
        assert "API key" in body["error"]["message"]
    status, body = get(server.url + "/v1/models", {"Authorization": "Basic " + key})
    assert status == 401
    good = client(server, key)
    assert [m.id for m in good.models.list().data] == ["smollm2"]
    r = good.chat.completions.create(model="smollm2", max_tokens=2,
                                     messages=[{"role": "user", "content": "hi"}])
    assert r.usage.completion_tokens >= 1
    streamed = list(good.completions.create(model="smollm2", prompt="ab", max_tokens=2,
                                            stream=True))
    assert streamed
    for path in ("/health", "/ready", "/metrics"):
        status, _ = get(server.url + path)
        assert status in (200, 503), path       # /ready: 503 while warming, never 401
    assert get(server.url + "/health")[0] == 200
    assert get(server.url + "/metrics")[0] == 200
    _, metrics = get(server.url + "/metrics")
    assert 'poot_http_requests_total{route="/v1/models",status="401"} 2.0' in metrics
    assert 'poot_http_requests_total{route="other",status="401"} 1.0' in metrics


def test_api_key_flag(tiny):
    with serve(tiny, "--max-batch", "1", "--max-seq", str(seeds.CTX), "--api-key", KEY) as s:
        check_auth(s, KEY)


def test_api_key_from_the_environment(tiny, monkeypatch):
    monkeypatch.setenv("POOT_API_KEY", KEY)
    with serve(tiny, "--max-batch", "1", "--max-seq", str(seeds.CTX)) as s:
        check_auth(s, KEY)


def test_no_key_no_auth(tiny, monkeypatch):
    monkeypatch.delenv("POOT_API_KEY", raising=False)
    with serve(tiny, "--max-batch", "1", "--max-seq", str(seeds.CTX)) as s:
        assert [m.id for m in client(s, "anything").models.list().data] == ["smollm2"]
        assert get(s.url + "/v1/models")[0] == 200
