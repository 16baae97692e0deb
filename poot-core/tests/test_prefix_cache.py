"""Prefix caching (poot.runtime.prefix_cache through BlockAllocator and Session): the hash
chain, shared blocks and their references, LRU eviction when the pool is short, keys kept
apart, and a session whose prompt starts with cached blocks giving the logits of one that
feeds the whole prompt (f32 and q8_0 caches: a q8_0 block's codes and scales are shared)."""
from __future__ import annotations

import numpy as np
import pytest
from poot.errors import CapacityError
from poot.models.llama import build_decoder, random_weights, tiny_config
from poot.runtime.kv import BlockAllocator
from poot.runtime.prefix_cache import PrefixCache, chain, root
from poot.runtime.session import Session


def _cached(pool_blocks: int = 8, block: int = 4, capacity: int = 16) -> BlockAllocator:
    return BlockAllocator(pool_blocks * block, block, capacity, prefix_cache=True)


def _run(alloc: BlockAllocator, seq, prompt, key: str = "") -> int:
    """Open `seq`, take its cached blocks, feed the rest (as a step would), seal."""
    alloc.open(seq, key)
    hit = alloc.reuse(seq, prompt)
    alloc.reserve(seq, len(prompt) - hit, prompt[hit:])
    alloc.seal(seq)
    return hit


def test_a_digest_names_the_whole_prefix_and_the_key():
    a, b = [1, 2, 3, 4], [5, 6, 7, 8]
    assert chain(root("k"), a) == chain(root("k"), list(np.array(a)))
    assert chain(chain(root("k"), a), b) != chain(chain(root("k"), b), b)   # parent counts
    assert chain(root("k"), a) != chain(root("other"), a)
    assert chain(root("k"), a) != chain(root("k"), [1, 2, 3, 5])


def test_a_prompt_starts_with_the_cached_blocks_and_feeds_at_least_one_token():
    alloc = _cached()
    prompt = list(range(10, 20))                   # 10 tokens: 2 full blocks of 4
    assert _run(alloc, "a", prompt) == 0
    first = alloc.blocks("a")
    assert alloc.cache.blocks == 2                  # the partial third block stays private
    assert _run(alloc, "b", prompt[:8] + [99, 98]) == 8
    assert alloc.blocks("b")[:2] == first[:2]       # shared, read-only
    assert alloc.blocks("b")[2] not in first        # its own rows go to a block of its own
    slots = alloc.slot_map("b")[:8]
    np.testing.assert_array_equal(slots, alloc.slot_map("a")[:8])
    # a prompt of exactly two cached blocks takes one: its last token is fed again
    alloc.open("c")
    assert alloc.reuse("c", prompt[:8]) == 4
    assert alloc.cache.hit_tokens == 12 and alloc.cache.queried_tokens == 28
    # a different block in the middle ends the match there
    alloc.open("d")
    assert alloc.reuse("d", [10, 11, 12, 13, 0, 0, 0, 0, 18]) == 4


def test_references_keep_shared_blocks_and_released_ones_wait_in_the_lru():
    alloc = _cached(pool_blocks=6)
    prompt = list(range(9))                         # 2 full blocks + 1 token
    _run(alloc, "a", prompt)
    _run(alloc, "b", prompt)
    shared = alloc.blocks("b")[:2]
    assert [alloc.cache.refs[b] for b in shared] == [2, 2] and alloc.free == 2
    alloc.close("a")           # a's private third block is free; the shared ones are held
    assert alloc.free == 3 and alloc.cache.evictable == 0
    alloc.close("b")
    assert alloc.free == 6 and alloc.cache.evictable == 2 and alloc.cache.blocks == 2
    assert alloc.reusable("", prompt) == (2, 2)
    _run(alloc, "c", prompt)                        # held again: out of the LRU
    assert alloc.blocks("c")[:2] == shared and alloc.cache.evictable == 0
    assert alloc.free == 3


def test_a_short_pool_evicts_the_least_recently_used_blocks_first():
    alloc = _cached(pool_blocks=5)
    old, new = list(range(100, 109)), list(range(200, 209))
    _run(alloc, "old", old)
    alloc.close("old")
    _run(alloc, "new", new)
    alloc.close("new")
    assert alloc.cache.blocks == 4 and alloc.free == 5
    alloc.open("x")
    alloc.reserve("x", 8)        # one free block, then the oldest cached one: old's tail
    assert alloc.cache.evicted == 1
    alloc.open("y")
    assert alloc.reuse("y", old) == 4               # its head is left, its tail is gone
    alloc.close("y")
    alloc.open("z")
    assert alloc.reuse("z", new) == 8               # the newer chain is whole
    alloc.close("z")
    alloc.close("x")
    # every block back: free ones and cached ones
    assert alloc.free == 5
    alloc.open("all")
    alloc.reserve("all", 16)                        # a full sequence evicts what it must
    with pytest.raises(CapacityError, match="out of blocks"):
        alloc.open("more")
        alloc.reserve("more", 8)


def test_keys_and_unknown_tokens_keep_blocks_apart():
    alloc = _cached()
    prompt = list(range(9))
    _run(alloc, "a", prompt, key="adapter=1")
    alloc.open("b", "adapter=2")
    assert alloc.reuse("b", prompt) == 0            # another adapter's rows differ
    alloc.open("c", "adapter=1")
    assert alloc.reuse("c", prompt) == 8
    # tokens fed on the device are not known: no block of them is cached until the
    # sequence closes with its ids
    alloc.open("d")
    alloc.reserve("d", 4, [7, 7, 7, 7])
    alloc.reserve("d", 4)
    alloc.seal("d")
    assert alloc.cache.blocks == 3
    alloc.close("d", [7, 7, 7, 7, 8, 8, 8, 8])
    assert alloc.cache.blocks == 4
    alloc.open("e")
    assert alloc.reuse("e", [7, 7, 7, 7, 8, 8, 8, 8, 9]) == 8
    # without ids (a failed step), a closing sequence caches nothing more
    alloc.open("f")
    alloc.reserve("f", 4)
    alloc.close("f")
    assert alloc.cache.blocks == 4


def test_two_sequences_computing_one_prefix_keep_one_copy():
    alloc = _cached()
    prompt = list(range(5))
    for seq in ("a", "b"):       # both miss: neither was sealed when the other opened
        alloc.open(seq)
        alloc.reuse(seq, prompt)
        alloc.reserve(seq, 5, prompt)
    alloc.seal("a")
    alloc.seal("b")
    assert alloc.cache.blocks == 1
    alloc.close("a")
    alloc.close("b")
    assert alloc.free == 8


def test_the_cache_turns_on_and_off_only_with_no_sequence_open():
    alloc = BlockAllocator(32, 4, 16)
    assert alloc.cache is None and alloc.reusable("", [1, 2, 3, 4, 5]) == (0, 0)
    alloc.open("a")
    assert alloc.reuse("a", [1, 2, 3, 4, 5]) == 0
    with pytest.raises(CapacityError, match="no sequence open"):
        alloc.use_prefix_cache(True)
    alloc.close("a", [1, 2, 3, 4, 5])
    alloc.use_prefix_cache(True)
    assert isinstance(alloc.cache, PrefixCache) and alloc.free == 8


CFG = tiny_config(dim=64, heads=2, kv_heads=1, head_dim=32, ffn=96, max_seq=32)


def _session(kv_dtype: str, cached: bool) -> Session:
    w = random_weights(CFG, seed=11)

    def make(tokens, b):
        return build_decoder(CFG, w, tokens=tokens, batch=b, kv="paged", pool_slots=64,
                             logits="rows" if tokens > 1 else "all", kv_dtype=kv_dtype)
    consts = {**w.arrays, **make(1, 1).consts}
    s = Session(make, consts, kv="paged", capacity=CFG.max_seq, batch=2, prefill_tokens=4,
                pool_slots=64, block=4, target="reference")
    s.blocks.use_prefix_cache(cached)
    return s


@pytest.mark.parametrize("kv_dtype", ["f32", "q8_0"])
def test_a_prompt_on_cached_blocks_gives_the_logits_of_the_whole_prompt(kv_dtype):
    rng = np.random.default_rng(12)
    system = list(rng.integers(0, CFG.vocab, 10))
    prompts = {"a": system + [1, 2, 3], "b": system + [4, 5], "c": system[:8]}
    answers = {}
    for cached in (False, True):
        s = _session(kv_dtype, cached)
        got = {}
        for seq, prompt in prompts.items():
            s.open(seq)
            hit = s.reuse(seq, prompt)
            assert hit == (0 if not cached or seq == "a" else 4 if seq == "c" else 8)
            logits = s.prefill(seq, prompt[hit:])
            toks = [int(np.argmax(logits))]
            for _ in range(4):
                toks.append(int(np.argmax(s.decode({seq: toks[-1]})[seq])))
            got[seq] = (logits, toks)
            if seq == "a":
                pools = {n: s.executor(1, 1).read_state(n).copy()
                         for n in s.state.buffers}
            s.close(seq, prompt + toks)
        if cached:       # the shared blocks were read, never written
            rows = np.arange(8)            # a's first two blocks: slots 0..7
            for n, pool in pools.items():
                np.testing.assert_array_equal(s.executor(1, 1).read_state(n)[rows],
                                              pool[rows])
        answers[cached] = got
    for seq in prompts:
        (x, tx), (y, ty) = answers[False][seq], answers[True][seq]
        np.testing.assert_allclose(x, y, rtol=1e-4, atol=1e-4)
        assert tx == ty


def test_a_session_key_separates_adapters():
    s = _session("f32", True)
    s.row_slots["adapter"] = {}
    prompt = list(range(9))
    s.open("a", {"adapter": 1})
    s.prefill("a", prompt)
    s.close("a", prompt)
    assert s.reusable(prompt, {"adapter": 2}) == (0, 0)
    assert s.reusable(prompt, {"adapter": 1}) == (2, 2)
    assert s.reusable(prompt, {"adapter": 1}, key="kv=q8_0") == (0, 0)
