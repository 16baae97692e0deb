"""Prefix caching in `poot serve` (on by default; `--no-prefix-cache` turns it off), with the
fuzzer's tiny Llama (a byte vocabulary, so the system prompt spans many blocks) on the
reference backend: chat requests that share a long system prompt answer
the same greedy texts with and without the cache, the requests after the first prefill only
what follows the cached blocks (GET /stats), a short pool evicts cached blocks and still
answers the same, and every block is back in the pool afterwards."""
from __future__ import annotations

import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import openai
import pytest
from serve_process import serve

sys.path.insert(0, str(Path(__file__).parent / "fuzz"))
import seeds  # noqa: E402

pytestmark = pytest.mark.slow

SYSTEM = ("You are a careful assistant for a bakery in Lyon. Answer in one short sentence. "
          "Closed on Monday.")
QUESTIONS = ["When do you open?", "Do you sell brioche?", "Can I pay by card?",
             "Are you open on Monday?", "How early must I order a cake?"]
ARGS = ("--max-batch", "4", "--max-seq", "256", "--prefill-chunk", "16")


def _ask(client, question: str) -> str:
    got = client.chat.completions.create(
        model="smollm2", max_tokens=12, temperature=0,
        messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}])
    return got.choices[0].message.content


def _session(model, *args: str) -> tuple[list[str], list[str], dict, dict]:
    """One request alone, then the rest at once; the texts and /stats after each part."""
    with serve(model, *ARGS, *args) as server:
        client = openai.OpenAI(base_url=server.base, api_key="unused", max_retries=0,
                               timeout=300)
        first = [_ask(client, QUESTIONS[0])]
        after_first = server.wait_idle()
        with ThreadPoolExecutor(len(QUESTIONS) - 1) as pool:
            rest = list(pool.map(lambda q: _ask(client, q), QUESTIONS[1:]))
        return first, rest, after_first, server.wait_idle()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """The tiny Llama with room for the system prompt (its bytes are its tokens)."""
    kvs = seeds.set_kv(seeds.llama_kvs(), "llama.context_length", seeds.U32, 512)
    return seeds.tiny_llama_gguf(tmp_path_factory.mktemp("tiny") / "tiny.gguf", kvs)


@pytest.fixture(scope="module")
def uncached(tiny):
    return _session(tiny, "--no-prefix-cache")


def test_cached_prefixes_answer_the_same_and_prefill_less(tiny, uncached):
    off, on = uncached, _session(tiny)
    assert on[0] + on[1] == off[0] + off[1]
    assert all(text for text in on[0] + on[1])
    _, _, off_first, off_end = off
    _, _, on_first, on_end = on
    assert not off_end["prefix_cache"] and on_end["prefix_cache"]
    assert off_end["cached_prompt_tokens"] == 0
    assert off_end["prefilled_tokens"] == off_end["prompt_tokens"]
    # the first request found nothing; each later one found the system prompt's blocks
    assert on_first["cached_prompt_tokens"] == 0 and on_first["prefix_cache_blocks"] > 0
    shared = on_end["cached_prompt_tokens"] // (len(QUESTIONS) - 1)
    assert shared >= 4 * on_end["block_size"] and shared % on_end["block_size"] == 0
    assert on_end["prefilled_tokens"] == on_end["prompt_tokens"] - on_end["cached_prompt_tokens"]
    assert on_end["prefilled_tokens"] < off_end["prefilled_tokens"] - 3 * shared
    assert 0 < on_end["prefix_cache_hit_rate"] < 1
    for stats in (off_end, on_end):               # every block back: free or cached
        assert stats["free_blocks"] == stats["pool_blocks"] and stats["failed"] == 0


def test_a_short_pool_evicts_cached_blocks_and_answers_the_same(tiny, uncached):
    # 12 blocks: one or two requests at a time; the blocks cached by earlier requests are
    # evicted as later ones need them
    on = _session(tiny, "--kv-pool", "192")
    assert on[0] + on[1] == uncached[0] + uncached[1]
    end = on[3]
    assert end["prefix_cache_evicted"] > 0 and end["cached_prompt_tokens"] > 0
    assert end["free_blocks"] == end["pool_blocks"] == 192 // end["block_size"]
    assert end["failed"] == 0
