"""Session.greedy keeps a decode step queued ahead: the tokens equal those of one
synchronous argmax step after another, on dense and paged KV, and an iterator closed early
settles its step in flight and leaves the sequence where the steps left it."""
from __future__ import annotations

import numpy as np
import pytest
from poot.errors import BindError
from poot.models.llama import build_decoder, random_weights, tiny_config
from poot.runtime.session import Session


@pytest.fixture(scope="module")
def model():
    c = tiny_config(layers=2, max_seq=24)
    return c, random_weights(c, seed=5)


def session(model, kv):
    c, w = model
    pool = {"pool_slots": 64} if kv == "paged" else {}

    def make(tokens, b, sample=None):
        return build_decoder(c, w, tokens=tokens, batch=b, kv=kv, sample=sample, **pool)
    consts = {**w.arrays, **make(1, 1).consts}
    return Session(make, consts, kv=kv, capacity=c.max_seq, prefill_tokens=4,
                   target="reference", make_sampled=lambda b, mode: make(1, b, mode),
                   **({"pool_slots": 64, "block": 4} if kv == "paged" else {}))


PROMPT = [3, 17, 42, 8, 61]


def stepwise(model, kv, count):
    s = session(model, kv)
    s.open("a")
    tok = int(np.argmax(s.prefill("a", PROMPT)))
    out = []
    for _ in range(count):
        tok = int(s.decode_sampled({"a": tok}, "argmax", lambda b: {})[0])
        out.append(tok)
    return tok, out


@pytest.mark.parametrize("kv", ["dense", "paged"])
def test_greedy_chain_equals_one_step_at_a_time(model, kv):
    _, want = stepwise(model, kv, 9)
    s = session(model, kv)
    s.open("a")
    first = int(np.argmax(s.prefill("a", PROMPT)))
    assert list(s.greedy("a", first, 9)) == want
    assert s.length("a") == len(PROMPT) + 9


@pytest.mark.parametrize("kv", ["dense", "paged"])
def test_closing_early_settles_the_step_in_flight(model, kv):
    _, want = stepwise(model, kv, 6)
    s = session(model, kv)
    s.open("a")
    chain = s.greedy("a", int(np.argmax(s.prefill("a", PROMPT))), 6)
    got = [next(chain) for _ in range(3)]
    chain.close()
    assert got == want[:3]
    # the fourth step was queued ahead of the third token's read: its position is claimed
    assert s.length("a") == len(PROMPT) + 4
    s.close("a")
    s.open("b")                       # the session goes on: a new sequence decodes as alone
    assert list(s.greedy("b", int(np.argmax(s.prefill("b", PROMPT))), 6)) == want


def test_a_chain_fed_out_of_order_is_refused(model):
    s = session(model, "paged")
    s.open("a")
    s.prefill("a", PROMPT)
    pending = s.decode_launch({"a": 1})
    s.open("b")
    with pytest.raises(BindError, match="runs its sequences in its order"):
        s.decode_launch(["b"], after=pending)
