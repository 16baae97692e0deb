"""A session's sampled decode steps take the sampler's slots from their owner, the model's
sampler: a rehearsal of a "full" step fills its padding rows with the injected
`padding_draws`, and without them is refused; an "argmax" step takes no sampler slot."""
from __future__ import annotations

import pytest
from poot.errors import BindError
from poot.models.llama import build_decoder, random_weights, tiny_config
from poot.models.sample_graph import slot_values
from poot.runtime.session import Session


@pytest.fixture(scope="module")
def model():
    c = tiny_config(layers=1, max_seq=16)
    return c, random_weights(c, seed=7)


def session(model, **kw):
    c, w = model

    def make(tokens, b, sample=None):
        return build_decoder(c, w, tokens=tokens, batch=b, kv="paged", pool_slots=32,
                             sample=sample)
    consts = {**w.arrays, **make(1, 1).consts}
    return Session(make, consts, kv="paged", capacity=c.max_seq, batch=2, prefill_tokens=4,
                   pool_slots=32, block=4, target="reference",
                   make_sampled=lambda b, mode: make(1, b, mode), **kw)


def test_padding_rows_of_a_full_step_take_the_injected_draws(model):
    asked = []

    def padding(b, mode):
        asked.append((b, mode))
        return slot_values([], b, mode)

    s = session(model, padding_draws=padding)
    free = s.blocks.free
    s.rehearse(1, 2, "full")
    s.rehearse(1, 2, "argmax")
    assert asked == [(2, "full")] and s.blocks.free == free
    assert {(1, 2, "full"), (1, 2, "argmax")} <= set(s.executors)


def test_a_full_step_without_padding_draws_is_refused(model):
    with pytest.raises(BindError, match="no padding_draws"):
        session(model).rehearse(1, 2, "full")
