"""Session plans per batch size: several sequences' prefill chunks in one step, decode steps
through the smallest plan that holds the batch; both agree with each sequence run alone."""
from __future__ import annotations

import numpy as np
import pytest
from poot.errors import BindError
from poot.models.llama import build_decoder, random_weights, tiny_config
from poot.runtime.session import Session


@pytest.fixture(scope="module")
def model():
    c = tiny_config(layers=2, max_seq=32)
    return c, random_weights(c, seed=11)


def session(model, batch=1, logits="all", **kw):
    c, w = model

    def make(tokens, b):
        return build_decoder(c, w, tokens=tokens, batch=b, kv="paged", pool_slots=128,
                             logits=logits if tokens > 1 else "all")
    consts = {**w.arrays, **make(1, 1).consts}
    return Session(make, consts, kv="paged", capacity=c.max_seq, batch=batch,
                   prefill_tokens=4, pool_slots=128, block=4, target="reference", **kw)


def alone(model, prompt, steps):
    s = session(model)
    s.open(0)
    out = [s.prefill(0, prompt)]
    for _ in range(steps):
        out.append(s.decode({0: int(np.argmax(out[-1]))})[0])
    return out


def test_prefill_rows_and_decode_buckets_match_each_sequence_alone(model):
    c, _ = model
    rng = np.random.default_rng(3)
    prompts = {"a": rng.integers(0, c.vocab, 7), "b": rng.integers(0, c.vocab, 3),
               "c": rng.integers(0, c.vocab, 5)}
    s = session(model, batch=4, decode_batches=(1, 2), prefill_batches=(2, 4))
    assert s.decode_batches == [1, 2, 4] and s.prefill_batches == [1, 2, 4]
    free = s.blocks.free
    for plan in ((4, 4), (1, 4)):        # padding rows: no KV written, no block taken
        s.rehearse(*plan)
    assert s.blocks.free == free
    fed = dict.fromkeys(prompts, 0)
    last = {}
    for k in prompts:
        s.open(k)
    while any(fed[k] < len(p) for k, p in prompts.items()):
        chunks = {k: p[fed[k]: fed[k] + 4] for k, p in prompts.items() if fed[k] < len(p)}
        for k, row in zip(chunks, s.prefill_rows(chunks), strict=True):
            fed[k] += len(chunks[k])
            last[k] = row
    assert {(4, 4), (4, 2)} <= set(s.executors)          # 3 chunks, then 2
    got = {k: [last[k]] for k in prompts}
    for live in (["a", "b", "c"], ["a", "c"], ["c"]):   # batches of 3, 2 and 1 rows
        rows = s.decode_rows({k: int(np.argmax(got[k][-1])) for k in live})
        for k, row in zip(live, rows, strict=True):
            got[k].append(row)
    assert {(1, 4), (1, 2), (1, 1)} <= set(s.executors)
    for k, steps in (("a", 2), ("b", 1), ("c", 3)):
        for x, y in zip(alone(model, prompts[k], steps), got[k], strict=True):
            np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-5)


def test_prefill_rows_refuses_what_its_plans_cannot_take(model):
    s = session(model, batch=2, prefill_batches=(2,))
    for k in "xyz":
        s.open(k)
    with pytest.raises(BindError, match="1 to 2 paged sequences"):
        s.prefill_rows({k: [1] for k in "xyz"})
    with pytest.raises(BindError, match="chunk of 5 tokens"):
        s.prefill_rows({"x": [1, 2, 3, 4, 5]})
    assert s.length("x") == 0
    with pytest.raises(BindError, match="must lie in 1..2"):
        session(model, batch=2, decode_batches=(4,))


def test_prefill_head_on_each_sequences_last_row_only(model):
    """logits="rows": a prefill chunk's head runs on one row per sequence (its last real
    token, through slot `last`), and gives what the all-rows head gives at that row."""
    c, _ = model
    rng = np.random.default_rng(5)
    prompts = {"a": rng.integers(0, c.vocab, 6), "b": rng.integers(0, c.vocab, 3)}
    got = {}
    for logits in ("all", "rows"):
        s = session(model, batch=4, logits=logits, prefill_batches=(4,))
        for k in prompts:
            s.open(k)
        got[logits] = [s.prefill_rows({k: p[:4] for k, p in prompts.items()}),
                       s.prefill_rows({"a": prompts["a"][4:]})]
        heads = s.executor(4, 4).step(_padding(s, 4, 4)).result.shape
        assert heads == ((4 * 4, c.vocab) if logits == "all" else (4, c.vocab))
    for x, y in zip(got["all"], got["rows"], strict=True):
        np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-5)


def _padding(s, tokens, batch):
    """The slots of a step of padding rows only (nothing written)."""
    slots = {"tokens": np.zeros((batch, tokens), np.int32),
             "pos": np.zeros((batch, 1), np.int32),
             "write_map": np.full(batch * tokens, -1, np.int32),
             "slot_map": np.zeros((batch, s.capacity), np.int32)}
    if "last" in s.executor(tokens, batch).slots:
        slots["last"] = np.zeros(batch, np.int32)
    return slots
