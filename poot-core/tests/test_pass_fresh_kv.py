"""fresh_kv: a one-token step's attention over its own dense KV writes becomes one
FreshKVAttention reading the caches as they were and the step's rows where they are; the
writes follow it (in place, after the cache's last reader); near misses stay, with the
reason; the step keeps the oracle's results."""
from __future__ import annotations

from collections import Counter

import numpy as np
import poot
from poot.compiler import Policy
from poot.compiler.validate import validate
from poot.models.llama import build_decoder, const_inputs, random_weights, tiny_config
from poot.plan import plan
from poot.runtime.executor import Executor

CONFIG = tiny_config(layers=2)
#: the reference backend declares FreshKVAttention without electing it (inlined, its
#: definition copies the caches), so these tests ask for it
ASK = Policy(fuse={"FreshKVAttention"})


def _step(tokens=1, kv="dense", config=CONFIG, **kw):
    w = random_weights(config, seed=3)
    return build_decoder(config, w, tokens=tokens, kv=kv, **kw), w


def test_the_attention_reads_the_step_rows_and_the_writes_follow_it():
    step, w = _step()
    c = poot.compile(step.graph, "reference", policy=ASK)
    eqns = c.graph.eqns()
    ops = Counter(e.op.name for e in eqns)
    assert ops["FreshKVAttention"] == CONFIG.layers and not ops["Attention"]
    assert not ops["Rope"]                          # q is rotated as the attention reads it
    for i, e in enumerate(eqns):
        if e.op.name == "FreshKVAttention":
            # operands 1, 2: the caches as the step found them (state binders)
            assert all(c.graph.producer(x.id) is None for x in e.inputs[1:3])
            assert [x.op.name for x in eqns[i + 1:i + 3]] == ["RopeUpdateSlice",
                                                             "DynamicUpdateSlice"]
    validate(step.graph, c.graph, seed=4, trials=2, given=const_inputs(step, w))


def test_three_steps_match_the_step_compiled_without_it():
    """The caches written beside the attention, read by the next step: three decode steps
    against the same step without the pass (the reference runs every composite as its
    primitive definition, so this checks the definition, the pass and the planner's
    in-place writes together)."""
    step, w = _step()
    consts = const_inputs(step, w)
    exs = [Executor(plan(poot.compile(step.graph, "reference", policy=p)), consts)
           for p in (ASK, Policy(disable={"fresh_kv"}))]
    for pos, token in enumerate([5, 9, 2]):
        slots = {"tokens": np.array([token], np.int32), "pos": np.array([pos], np.int32)}
        got, want = (ex.step(slots).result for ex in exs)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    for name in exs[0].state_names():
        np.testing.assert_array_equal(exs[0].read_state(name), exs[1].read_state(name))


def test_near_misses_stay_apart():
    for step, why in ((_step(tokens=2)[0], "positions axis"),
                      (_step(config=tiny_config(layers=2, window=4, sliding=(True, False)))[0],
                       "not RopeUpdateSlice")):     # the sliding layer's ring
        c = poot.compile(step.graph, "reference", policy=ASK)
        assert why in c.explain(), c.explain()
    paged = poot.compile(_step(kv="paged", batch=1, pool_slots=32)[0].graph, "reference",
                         policy=ASK)
    assert "FreshKVAttention" not in {e.op.name for e in paged.graph.eqns()}


def test_the_reference_backend_keeps_it_apart_unless_asked():
    """Its plan would copy both caches of every layer each step (the definition's writes):
    the reference backend forms the op only when a policy asks for it."""
    c = poot.compile(_step()[0].graph, "reference")
    assert "FreshKVAttention" not in {e.op.name for e in c.graph.eqns()}
    assert "declared but not elected" in c.explain()
