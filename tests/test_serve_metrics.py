"""GET /metrics of `poot serve` (on the fuzzer's tiny Llama), in the Prometheus text format:
requests by route and status, prompt and generated tokens, time to first token and
inter-token latency histograms, KV blocks used and free, running and queued requests, and
the prefix cache's token counters; each checked against what the requests were answered."""
from __future__ import annotations

import sys
import urllib.request
from pathlib import Path

import openai
import pytest
from serve_process import serve

sys.path.insert(0, str(Path(__file__).parent / "fuzz"))
import seeds  # noqa: E402


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return seeds.tiny_llama_gguf(tmp_path_factory.mktemp("tiny") / "tiny.gguf")


def scrape(server) -> dict:
    """{(name, labels as a sorted tuple): value} of every sample."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(server.url + "/metrics", timeout=30) as r:
        assert r.status == 200
        assert r.headers["Content-Type"].startswith("text/plain; version=")
        text = r.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_metrics_count_what_the_requests_were_answered(tiny):
    with serve(tiny, "--max-batch", "2", "--max-seq", str(seeds.CTX)) as server:
        client = openai.OpenAI(base_url=server.base, api_key="unused", max_retries=0,
                               timeout=120)
        before = scrape(server)
        assert before[("poot_generated_tokens_total", ())] == 0
        assert before[("poot_time_to_first_token_seconds_count", ())] == 0
        prompt = generated = 0
        for n in range(3):
            r = client.chat.completions.create(
                model="smollm2", messages=[{"role": "user", "content": f"hello {n}"}],
                max_tokens=5, extra_body={"ignore_eos": True})
            prompt += r.usage.prompt_tokens
            generated += r.usage.completion_tokens
        chunks = list(client.completions.create(model="smollm2", prompt="abc", max_tokens=4,
                                                stream=True, extra_body={"ignore_eos": True},
                                                stream_options={"include_usage": True}))
        prompt += chunks[-1].usage.prompt_tokens
        generated += chunks[-1].usage.completion_tokens
        with pytest.raises(openai.NotFoundError):
            client.completions.create(model="nope", prompt="abc", max_tokens=1)
        with pytest.raises(openai.BadRequestError):
            client.completions.create(model="smollm2", prompt="", max_tokens=1)
        server.wait_idle()
        m = scrape(server)
        stats = server.stats()

    def requests(route, status):
        return m.get(("poot_http_requests_total", (("route", route), ("status", status))), 0)

    assert requests("/v1/chat/completions", "200") == 3
    assert requests("/v1/completions", "200") == 1
    assert requests("/v1/completions", "404") == 1
    assert requests("/v1/completions", "400") == 1
    assert m[("poot_prompt_tokens_total", ())] == prompt
    assert m[("poot_generated_tokens_total", ())] == generated == 19
    assert m[("poot_sequences_total", (("outcome", "finished"),))] == 4
    # every request's first token, and each token after it
    assert m[("poot_time_to_first_token_seconds_count", ())] == 4
    assert m[("poot_inter_token_latency_seconds_count", ())] == generated - 4
    assert 0 < m[("poot_time_to_first_token_seconds_sum", ())] < 120
    assert m[("poot_time_to_first_token_seconds_bucket", (("le", "+Inf"),))] == 4
    free = m[("poot_kv_blocks", (("state", "free"),))]
    used = m[("poot_kv_blocks", (("state", "used"),))]
    assert free + used == stats["pool_blocks"] and free == stats["free_blocks"]
    assert m[("poot_running_requests", ())] == 0 and m[("poot_queued_requests", ())] == 0
    if stats.get("prefix_cache"):       # fed by the prefix cache where it is on
        assert m[("poot_prefix_cache_queried_tokens_total", ())] == \
            stats["prefix_cache_queried_tokens"]
        assert m[("poot_prefix_cache_hit_tokens_total", ())] == \
            stats["prefix_cache_hit_tokens"]
