"""KV caches: the block allocator, and Session prefill/decode in dense and paged form."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from poot.errors import CapacityError
from poot.models.llama import build_decoder, random_weights, tiny_config
from poot.runtime.kv import BlockAllocator, DenseCache
from poot.runtime.session import Session

# the helpers beside this file (pytest's importlib mode puts no test folder on sys.path)
sys.path.insert(0, str(Path(__file__).parent))
from test_runtime_support import OracleStepper  # noqa: E402


def test_block_allocator_hands_out_frees_and_reuses_blocks():
    alloc = BlockAllocator(pool_slots=16, block=4, capacity=12)
    alloc.open("a")
    alloc.open("b")
    np.testing.assert_array_equal(alloc.reserve("a", 3), [0, 1, 2])
    np.testing.assert_array_equal(alloc.reserve("b", 5), [4, 5, 6, 7, 8])
    np.testing.assert_array_equal(alloc.reserve("a", 2), [3, 12])       # a's second block
    smap = alloc.slot_map("a")
    assert smap.dtype == np.int32 and smap.shape == (12,)
    np.testing.assert_array_equal(smap[:5], [0, 1, 2, 3, 12])
    assert alloc.free == 0
    with pytest.raises(CapacityError, match="out of blocks"):
        alloc.reserve("b", 4)
    assert alloc.length("b") == 5 and alloc.blocks("b") == [1, 2]        # nothing changed
    a_blocks = alloc.blocks("a")
    alloc.close("a")
    alloc.open("c")
    alloc.reserve("c", 8)
    assert sorted(alloc.blocks("c")) == sorted(a_blocks)                 # a's blocks reused
    with pytest.raises(CapacityError, match="slot map holds 12"):
        alloc.reserve("c", 5)
    with pytest.raises(CapacityError, match="not open"):
        alloc.reserve("a", 1)


def test_token_at_a_time_claims_the_slots_a_whole_chunk_claims():
    one, chunk = (BlockAllocator(pool_slots=32, block=4, capacity=16) for _ in range(2))
    for alloc in (one, chunk):
        alloc.open("x")
        alloc.open("y")
        alloc.reserve("y", 3)
    assert one.blocks_needed({"x": 6, "y": 1}) == 2 and one.blocks_needed({"y": 2}) == 1
    got = [int(one.reserve("x", 1)[0]) for _ in range(6)]     # across a block boundary
    np.testing.assert_array_equal(got, chunk.reserve("x", 6))
    np.testing.assert_array_equal(one.slot_map("x"), chunk.slot_map("x"))
    assert one.blocks("x") == chunk.blocks("x") and one.length("x") == 6


def test_dense_cache_refuses_to_overrun():
    cache = DenseCache(4)
    assert cache.reserve(3) == 0
    with pytest.raises(CapacityError):
        cache.reserve(2)
    assert cache.length == 3


def _paged_session(config, weights, pool=64, batch=1, prefill=4):
    def make(tokens, b):
        return build_decoder(config, weights, tokens=tokens, batch=b, kv="paged",
                             pool_slots=pool)
    consts = {**weights.arrays, **make(1, 1).consts}
    return Session(make, consts, kv="paged", capacity=config.max_seq, batch=batch,
                   prefill_tokens=prefill, pool_slots=pool, block=4, target="reference")


def _greedy(session, prompts: dict, steps: int, together: bool):
    outs = {}
    for seq, prompt in prompts.items():
        session.open(seq)
        outs[seq] = [session.prefill(seq, prompt)]
    for _ in range(steps):
        nxt = {s: int(np.argmax(o[-1])) for s, o in outs.items()}
        got = session.decode(nxt) if together else {
            s: session.decode({s: t})[s] for s, t in nxt.items()}
        for s in outs:
            outs[s].append(got[s])
    return outs


@pytest.fixture(scope="module")
def model():
    c = tiny_config(layers=2, max_seq=32)
    return c, random_weights(c, seed=5)


def test_interleaved_sequences_in_one_pool_match_each_run_alone(model):
    c, w = model
    rng = np.random.default_rng(6)
    prompts = {"a": rng.integers(0, c.vocab, 7), "b": rng.integers(0, c.vocab, 5)}
    alone = {s: _greedy(_paged_session(c, w), {s: p}, 5, False)[s] for s, p in prompts.items()}
    shared = _greedy(_paged_session(c, w), prompts, 5, together=False)
    for s in prompts:
        for x, y in zip(alone[s], shared[s], strict=True):
            np.testing.assert_array_equal(x, y)
    # one batched decode plan for both sequences: the same numbers up to GEMM vs GEMV order
    batched = _greedy(_paged_session(c, w, batch=2), prompts, 5, together=True)
    for s in prompts:
        for x, y in zip(alone[s], batched[s], strict=True):
            np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-5)


def test_paged_session_matches_the_oracle_token_by_token(model):
    c, w = model
    session = _paged_session(c, w, prefill=4)
    decode = build_decoder(c, w, kv="paged", pool_slots=64)
    oracle = OracleStepper(decode.graph, session.consts)
    prompt = np.random.default_rng(7).integers(0, c.vocab, 6)
    session.open("s")
    got = session.prefill("s", prompt)
    slots_map = np.zeros((1, c.max_seq), np.int32)
    for pos, tok in enumerate(prompt):
        slots_map[0, pos] = session.blocks.slot_map("s")[pos]
        want = oracle.step({"tokens": [[tok]], "pos": [[pos]],
                            "write_map": slots_map[0, pos:pos + 1], "slot_map": slots_map})
    np.testing.assert_allclose(got, want[0], rtol=1e-5, atol=1e-5)
    # the same pool rows, whether written by the 4-token prefill plan or token by token
    for name, pool in oracle.state.items():
        used = session.blocks.slot_map("s")[: len(prompt)]
        np.testing.assert_allclose(session.executor(1, 1).read_state(name)[used], pool[used],
                                   rtol=1e-5, atol=1e-6)


def test_finished_sequence_frees_its_blocks_and_a_full_pool_refuses(model):
    c, w = model
    session = _paged_session(c, w, pool=16, prefill=4)
    session.open("a")
    session.prefill("a", [1, 2, 3, 4, 5, 6, 7, 8, 9])                     # 3 blocks of 4
    session.open("b")
    with pytest.raises(CapacityError, match="out of blocks"):
        session.prefill("b", [1, 2, 3, 4, 5, 6, 7, 8])
    assert session.length("b") == 0                   # refused whole: nothing was fed
    freed = session.blocks.blocks("a")
    session.close("a")
    session.prefill("b", [1, 2, 3, 4, 5, 6, 7, 8])
    assert set(session.blocks.blocks("b")) <= set(freed) | {3}


def test_dense_session_prefill_then_decode_matches_the_oracle(model):
    c, w = model

    def make(tokens, b):
        return build_decoder(c, w, tokens=tokens, batch=b, kv="dense")
    decode = make(1, 1)
    consts = {**w.arrays, **decode.consts}
    session = Session(make, consts, kv="dense", capacity=c.max_seq, prefill_tokens=4,
                      target="reference")
    oracle = OracleStepper(decode.graph, consts)
    prompt = np.random.default_rng(8).integers(0, c.vocab, 6)
    session.open("s")
    got = [session.prefill("s", prompt)]
    want = [oracle.step({"tokens": [t], "pos": [i]}) for i, t in enumerate(prompt)][-1:]
    for i in range(3):
        tok = int(np.argmax(got[-1]))
        got.append(session.decode({"s": tok})["s"])
        want.append(oracle.step({"tokens": [tok], "pos": [len(prompt) + i]}))
    for x, y in zip(got, want, strict=True):
        np.testing.assert_allclose(x, y.reshape(-1), rtol=1e-5, atol=1e-5)
    # two plans, one cache: weights uploaded once, one set of KV buffers
    prefill_ex, decode_ex = session.executor(4, 1), session.executor(1, 1)
    assert prefill_ex.weights is decode_ex.weights and prefill_ex.state is decode_ex.state
    assert len(session.state.buffers) == 2 * c.layers
    with pytest.raises(CapacityError, match="dense KV cache holds"):
        session.open("t")


def test_session_plans_compile_results_and_compiled_graphs_without_compiling_again(
        model, monkeypatch):
    import poot

    c, w = model
    traced = _greedy(_paged_session(c, w), {"a": [5, 9, 2]}, 2, together=False)["a"]

    def make(tokens, b, as_graph):
        step = build_decoder(c, w, tokens=tokens, batch=b, kv="paged", pool_slots=64)
        compiled = poot.compile(step.graph, "reference")
        return compiled.graph if as_graph else compiled

    consts = {**w.arrays, **build_decoder(c, w, kv="paged", pool_slots=64).consts}
    real = poot.compile
    for as_graph in (False, True):
        calls = []
        monkeypatch.setattr(poot, "compile",
                            lambda *a, calls=calls, **k: calls.append(1) or real(*a, **k))
        s = Session(lambda t, b, g=as_graph: make(t, b, g), consts, kv="paged",
                    capacity=c.max_seq, prefill_tokens=4, pool_slots=64, block=4,
                    target="reference")
        got = _greedy(s, {"a": [5, 9, 2]}, 2, together=False)["a"]
        assert len(calls) == len(s.executors)           # only the builder's own compiles
        for x, y in zip(traced, got, strict=True):
            np.testing.assert_array_equal(x, y)
